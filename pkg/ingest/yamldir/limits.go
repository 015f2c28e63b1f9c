package yamldir

import (
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// Limits bound what reading one file may cost, so that a file can cost
// no more memory than a few times its limit: a file's size is checked
// before it is read, and a document's size once its aliases are expanded
// before it is expanded.
type Limits struct {
	// MaxFileSize is the largest file read, in bytes. Default 4 MiB.
	MaxFileSize int64
	// MaxNodes bounds a document's nodes, counted with its aliases
	// expanded (a YAML "billion laughs" is small until then). Default
	// 1,000,000.
	MaxNodes int64
	// MaxExpandedBytes bounds a document's scalar bytes, counted with its
	// aliases expanded. Default four times MaxFileSize.
	MaxExpandedBytes int64
}

// DefaultMaxFileSize is Limits.MaxFileSize's default.
const DefaultMaxFileSize = 4 << 20

func (l *Limits) defaults() {
	if l.MaxFileSize <= 0 {
		l.MaxFileSize = DefaultMaxFileSize
	}
	if l.MaxNodes <= 0 {
		l.MaxNodes = 1_000_000
	}
	if l.MaxExpandedBytes <= 0 {
		l.MaxExpandedBytes = 4 * l.MaxFileSize
	}
}

// readLimited reads a file of at most max bytes: its size is checked
// before it is read, and the read stops past max in case it grows.
func readLimited(path string, size, max int64) ([]byte, error) {
	if size > max {
		return nil, fmt.Errorf("the file is %d bytes; files of at most %d are read (--yaml-max-file-size)", size, max)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("the file grew past %d bytes while it was read; files of at most %d are read (--yaml-max-file-size)", max, max)
	}
	return data, nil
}

// expansion is a document's size with its aliases expanded.
type expansion struct {
	nodes, bytes int64
}

// checkExpansion returns why a parsed document is too large once its
// aliases are expanded ("" when it is not), without expanding it: each
// anchored node's size is counted once and added at each alias.
func checkExpansion(root *yaml.Node, l Limits) string {
	memo := map[*yaml.Node]expansion{}
	var size func(n *yaml.Node, depth int) expansion
	size = func(n *yaml.Node, depth int) expansion {
		if n == nil || depth > 10_000 {
			return expansion{}
		}
		if e, ok := memo[n]; ok {
			return e
		}
		memo[n] = expansion{} // an alias cycle counts nothing more
		e := expansion{nodes: 1, bytes: int64(len(n.Value))}
		if n.Kind == yaml.AliasNode {
			e = size(n.Alias, depth+1)
		}
		for _, c := range n.Content {
			ce := size(c, depth+1)
			// Saturate: a bomb's sizes overflow int64.
			e.nodes = min(e.nodes+ce.nodes, l.MaxNodes+1)
			e.bytes = min(e.bytes+ce.bytes, l.MaxExpandedBytes+1)
		}
		memo[n] = e
		return e
	}
	e := size(root, 0)
	switch {
	case e.nodes > l.MaxNodes:
		return fmt.Sprintf("the document expands to more than %d nodes through its aliases", l.MaxNodes)
	case e.bytes > l.MaxExpandedBytes:
		return fmt.Sprintf("the document expands to more than %d bytes through its aliases", l.MaxExpandedBytes)
	}
	return ""
}
