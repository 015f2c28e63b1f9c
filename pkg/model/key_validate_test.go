package model

import (
	"fmt"
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// TestValidateKey: a namespace must be a DNS label and a name no path
// step, wildcard or control character, before either makes a store key.
func TestValidateKey(t *testing.T) {
	for _, tc := range []struct {
		key  Key
		says string
	}{
		{Key{Kind: KindService, Namespace: "demo", Name: "greeter"}, ""},
		{Key{Kind: KindService, Namespace: "demo", Name: "reviews@c1"}, ""},
		{Key{Kind: KindEndpoints, Namespace: "demo", Name: "greeter/yaml"}, ""},
		{Key{Kind: KindService, Namespace: "../../etc", Name: "ok"}, "metadata.namespace"},
		{Key{Kind: KindService, Namespace: "*", Name: "ok"}, "metadata.namespace"},
		{Key{Kind: KindService, Namespace: "demo~x", Name: "ok"}, "metadata.namespace"},
		{Key{Kind: KindService, Namespace: "Demo", Name: "ok"}, "metadata.namespace"},
		{Key{Kind: KindService, Namespace: strings.Repeat("a", 64), Name: "ok"}, "metadata.namespace"},
		{Key{Kind: KindService, Namespace: "demo", Name: ".."}, "metadata.name"},
		{Key{Kind: KindService, Namespace: "demo", Name: "a\nb"}, "metadata.name"},
		{Key{Kind: KindEndpoints, Namespace: "demo", Name: "a/test~3"}, ""}, // a chunk
		{Key{Kind: KindEndpoints, Namespace: "demo", Name: "greeter/.."}, "metadata.name"},
	} {
		err := ValidateKey(tc.key)
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("%v: %v", tc.key, err)
		case tc.says != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.says)):
			t.Errorf("%v: %v, want an error on %s", tc.key, err, tc.says)
		}
	}
	long := ValidateKey(Key{Kind: KindService, Namespace: strings.Repeat("x", 400000), Name: "ok"})
	if long == nil || len(long.Error()) > 300 {
		t.Errorf("a 400 KB namespace: an error of %d bytes, want it truncated", len(long.Error()))
	}
}

// TestLongRegexIsQuotedShort: a rejected regex of 400 KB is quoted cut
// short, so that its log line stays a line.
func TestLongRegexIsQuotedShort(t *testing.T) {
	huge := "(" + strings.Repeat("a", 400<<10)
	err := validateStringMatch("spec.http[0].match[0].uri", &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: huge}})
	if err == nil || len(err.Error()) > 500 {
		t.Errorf("an error of %d bytes, want it short", len(fmt.Sprint(err)))
	}
}
