// Command pause is the pod sandbox of the local cluster (make cluster): it
// holds a pod's namespaces and sleeps until SIGTERM or SIGINT, then exits 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
