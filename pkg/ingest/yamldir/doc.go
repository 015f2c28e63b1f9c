// Package yamldir is the YAML-directory source: it reads every *.yaml and
// *.yml file below a directory as Kubernetes-style documents of Istio's
// networking kinds, normalizes them, and syncs them into the store; it
// reloads when a file changes and on a resync period. Removing a file
// removes its objects. A file that does not parse keeps its objects as they
// were, and is reported with the file and document.
//
// Source.Run owns its file watcher and returns after closing it.
package yamldir
