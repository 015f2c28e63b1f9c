// Package cli parses the commands' flags, each of which has an environment
// variable twin: --mesh-dir is also SHARDPILOT_MESH_DIR. A flag given on the
// command line wins over its twin.
package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// EnvName returns the environment twin of a flag.
func EnvName(flagName string) string {
	return "SHARDPILOT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args, then fills every flag not on the command line from its
// environment twin. It returns flag.ErrHelp after printing the help for -h.
func Parse(fs *flag.FlagSet, summary string, args []string) error {
	fs.Usage = func() { Usage(fs.Output(), fs, summary) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s (see --help)", strings.Join(fs.Args(), " "))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("$%s (twin of --%s): %w", EnvName(f.Name), f.Name, e)
			}
		}
	})
	return err
}

// Usage prints the summary and every flag with its default and twin.
func Usage(w io.Writer, fs *flag.FlagSet, summary string) {
	fmt.Fprintf(w, "%s\n\nUsage: %s [flags]\n\nFlags (each also read from its environment variable):\n", summary, fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%s  $%s%s\n      %s\n", f.Name, EnvName(f.Name), def, f.Usage)
	})
}
