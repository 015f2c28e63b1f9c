package main

import (
	"testing"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

// TestMain checks that the tests leave no goroutine behind.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
