package kube

// Started returns how many times the informers were started.
func (in *Informers) Started() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.started
}
