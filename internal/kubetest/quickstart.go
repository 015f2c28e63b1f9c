package kubetest

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Quickstart returns the commands of the chart README's first section
// (readme: deploy/helm/shardpilot/README.md), its continuation lines
// joined, after checking that the section is the quickstart: the commands
// the chart's tests and make e2e-cluster run as the README gives them.
func Quickstart(readme string) ([]string, error) {
	b, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	first := regexp.MustCompile(`(?m)^## .*$`).FindString(string(b))
	if first != "## Quickstart" {
		return nil, fmt.Errorf("%s: the first section is %q, want the quickstart", readme, first)
	}
	_, block, _ := strings.Cut(string(b), "## Quickstart")
	_, block, ok := strings.Cut(block, "```sh\n")
	if !ok {
		return nil, fmt.Errorf("%s: the quickstart has no sh block", readme)
	}
	block, _, _ = strings.Cut(block, "```")
	var cmds []string
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", ""), "\n") {
		if line = strings.Join(strings.Fields(line), " "); line != "" {
			cmds = append(cmds, line)
		}
	}
	return cmds, nil
}
