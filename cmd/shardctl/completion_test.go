package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
)

// TestCompletion: the bash script names every command and parses; a shell
// without a script is refused.
func TestCompletion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"completion", "bash"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for name := range commands {
		if !strings.Contains(out.String(), name) {
			t.Errorf("the script does not complete %s", name)
		}
	}
	check := exec.Command("bash", "-n")
	check.Stdin = &out
	if msg, err := check.CombinedOutput(); err != nil {
		t.Errorf("bash -n: %v %s", err, msg)
	}
	if err := run(context.Background(), []string{"completion", "fish"}, &out, &out); err == nil || !strings.Contains(err.Error(), "want bash or zsh") {
		t.Errorf("completion fish: %v", err)
	}
}
