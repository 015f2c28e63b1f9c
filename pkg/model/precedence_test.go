package model_test

import (
	"slices"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// TestRulesByPrecedence: a route's rules are ordered as the Gateway API
// ranks their matches, whatever order they were written in: a "/api"
// prefix written first no longer takes "/api/v1/products" from the longer
// prefix; an exact path first; a method, then more headers, then more
// query parameters win among equal paths; a rule of two matches is two;
// a rule without matches is last; equal ones keep their order.
func TestRulesByPrecedence(t *testing.T) {
	prefix := func(p string) *meshv1.StringMatch {
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: p}}
	}
	exact := &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: "/api/health"}}
	regex := &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/api/v[0-9]+/orders/.*"}}
	header := map[string]*meshv1.StringMatch{"x-canary": {Kind: &meshv1.StringMatch_Exact{Exact: "1"}}}
	rules := []*meshv1.HTTPRoute{
		{Name: "catch-all"},
		{Name: "api", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api")}}},
		{Name: "products", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api/v1/products")}}},
		{Name: "orders", Match: []*meshv1.HTTPMatch{{Uri: regex}}},
		{Name: "api-canary", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api"), Headers: header}}},
		{Name: "api-get", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api"), Method: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: "GET"}}}}},
		{Name: "two", Match: []*meshv1.HTTPMatch{{Uri: exact}, {Uri: prefix("/z")}}},
		{Name: "api-again", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api")}}},
	}
	var got []string
	for _, r := range model.ByPrecedence(rules) {
		got = append(got, r.Name)
	}
	want := []string{"two", "products", "api-get", "api-canary", "api", "api-again", "two", "orders", "catch-all"}
	if !slices.Equal(got, want) {
		t.Errorf("rules in order %v, want %v", got, want)
	}
}
