package model_test

import (
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// TestValidateSecurity: each security kind's invalid fields are named.
func TestValidateSecurity(t *testing.T) {
	rule := func(r *meshv1.AuthorizationRule) *meshv1.AuthorizationPolicy {
		return &meshv1.AuthorizationPolicy{Rules: []*meshv1.AuthorizationRule{r}}
	}
	good := rule(&meshv1.AuthorizationRule{
		From: []*meshv1.AuthorizationSource{{Principals: []string{"cluster.local/ns/a/sa/*"}, IpBlocks: []string{"10.0.0.0/8", "192.168.1.1"}}},
		To:   []*meshv1.AuthorizationOperation{{Paths: []string{"/pkg.Svc/*", "*/health"}, Methods: []string{"GET"}, Ports: []uint32{8080}}},
		When: []*meshv1.AuthorizationCondition{{Key: "request.headers[x-user]", Values: []string{"admin"}}, {Key: "destination.port", Values: []string{"8080"}}},
	})
	if err := model.Validate(good); err != nil {
		t.Errorf("a valid policy: %v", err)
	}
	for want, o := range map[string]model.Object{
		"spec.rules[0].from[0].source.ipBlocks[0]":   rule(&meshv1.AuthorizationRule{From: []*meshv1.AuthorizationSource{{IpBlocks: []string{"10.0.0.300"}}}}),
		"spec.rules[0].from[0].source.principals[0]": rule(&meshv1.AuthorizationRule{From: []*meshv1.AuthorizationSource{{Principals: []string{"*a*"}}}}),
		"spec.rules[0].to[0].operation.paths[0]":     rule(&meshv1.AuthorizationRule{To: []*meshv1.AuthorizationOperation{{Paths: []string{"/a/*/b"}}}}),
		"spec.rules[0].to[0].operation.methods[0]":   rule(&meshv1.AuthorizationRule{To: []*meshv1.AuthorizationOperation{{Methods: []string{"get"}}}}),
		"spec.rules[0].to[0].operation.ports[0]":     rule(&meshv1.AuthorizationRule{To: []*meshv1.AuthorizationOperation{{Ports: []uint32{70000}}}}),
		"spec.rules[0].when[0].key":                  rule(&meshv1.AuthorizationRule{When: []*meshv1.AuthorizationCondition{{Key: "connection.sni", Values: []string{"a"}}}}),
		"spec.rules[0].when[0]":                      rule(&meshv1.AuthorizationRule{When: []*meshv1.AuthorizationCondition{{Key: "source.ip"}}}),
		"spec.rules[0].when[0].values[0]":            rule(&meshv1.AuthorizationRule{When: []*meshv1.AuthorizationCondition{{Key: "destination.port", Values: []string{"x"}}}}),
		"spec.portLevelMtls":                         &meshv1.PeerAuthentication{PortModes: map[uint32]meshv1.MTLSMode{8080: meshv1.MTLSMode_MTLS_MODE_STRICT}},
		"spec.jwtRules[0].issuer":                    &meshv1.RequestAuthentication{JwtRules: []*meshv1.JWTRule{{}}},
		"spec.jwtRules[0].jwksUri":                   &meshv1.RequestAuthentication{JwtRules: []*meshv1.JWTRule{{Issuer: "a", JwksUri: "ftp://x"}}},
		"spec.jwtRules[0].jwks":                      &meshv1.RequestAuthentication{JwtRules: []*meshv1.JWTRule{{Issuer: "a", Jwks: "{"}}},
		"spec.jwtRules[1].issuer":                    &meshv1.RequestAuthentication{JwtRules: []*meshv1.JWTRule{{Issuer: "a"}, {Issuer: "a"}}},
	} {
		if err := model.Validate(o); err == nil || !strings.HasPrefix(err.Error(), want+":") {
			t.Errorf("%T: %v, want an error on %s", o, err, want)
		}
	}
}
