package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// completion prints a shell's completion script: the commands, the types
// of proxy-config and the flags.
func completion(_ context.Context, o *options, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want bash or zsh, got %q", args)
	}
	cmds := strings.Join(slices.Sorted(maps.Keys(commands)), " ")
	flags := "--admin-addrs --admin-ca-file --admin-token-file --etcd-ca-file --etcd-cert-file --etcd-endpoints --etcd-key-file " +
		"--etcd-password-file --etcd-username --kube-namespace --kube-reach --kube-selector --kubeconfig --namespace -n --all-namespaces -A --output -o --timeout --help --version"
	script := fmt.Sprintf(`# shardctl completion (bash): source <(shardctl completion bash)
_shardctl() {
  local cur prev cmd
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD-1]}"
  cmd="${COMP_WORDS[1]}"
  case "$prev" in
    -o|--output) COMPREPLY=($(compgen -W "table json yaml" -- "$cur")); return ;;
    --kube-reach) COMPREPLY=($(compgen -W "port-forward pod-ip" -- "$cur")); return ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur")); return
  fi
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur")); return
  fi
  case "$cmd" in
    proxy-config) [[ $COMP_CWORD -eq 3 ]] && COMPREPLY=($(compgen -W "clusters routes listeners endpoints secrets" -- "$cur")) ;;
    completion) COMPREPLY=($(compgen -W "bash zsh" -- "$cur")) ;;
  esac
}
complete -F _shardctl shardctl
`, flags, cmds)
	switch args[0] {
	case "bash":
	case "zsh":
		script = "# shardctl completion (zsh): source <(shardctl completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n" + script
	default:
		return fmt.Errorf("%q: want bash or zsh", args[0])
	}
	_, err := fmt.Fprint(o.stdout, script)
	return err
}
