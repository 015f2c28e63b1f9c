package kube

import (
	"sync"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Informers are one cluster's watches and caches, shared by the sources
// of its parts that a process leads (Config.Informers): however many
// parts one replica leads, it watches and caches the cluster once. They
// start with their first source and stop after their last.
type Informers struct {
	client  kubernetes.Interface
	dynamic dynamic.Interface

	mu      sync.Mutex
	users   int
	started int // how many times they were started (for tests)
	factory informers.SharedInformerFactory
	dyn     dynamicinformer.DynamicSharedInformerFactory
	stop    chan struct{}
}

// NewInformers returns a cluster's shared informers, not started.
func NewInformers(client kubernetes.Interface, dyn dynamic.Interface) *Informers {
	return &Informers{client: client, dynamic: dyn}
}

// acquire returns the factories (made, with the EndpointSlices' index by
// pod, for the first user), the channel that stops them, and the release
// every acquire is matched by: the last stops them.
func (in *Informers) acquire() (informers.SharedInformerFactory, dynamicinformer.DynamicSharedInformerFactory, <-chan struct{}, func(), error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.users == 0 {
		factory := informers.NewSharedInformerFactoryWithOptions(in.client, 0, informers.WithTransform(stripManagedFields))
		// Indexers are added before an informer starts: here, once.
		if err := factory.Discovery().V1().EndpointSlices().Informer().AddIndexers(cache.Indexers{byPod: slicePods}); err != nil {
			return nil, nil, nil, nil, err
		}
		in.factory, in.dyn = factory, dynamicinformer.NewDynamicSharedInformerFactory(in.dynamic, 0)
		in.stop = make(chan struct{})
		in.started++
	}
	in.users++
	factory, dyn, stop := in.factory, in.dyn, in.stop
	var once sync.Once
	release := func() {
		once.Do(func() {
			in.mu.Lock()
			in.users--
			last := in.users == 0
			in.mu.Unlock()
			if last {
				close(stop)
				factory.Shutdown()
				dyn.Shutdown()
			}
		})
	}
	return factory, dyn, stop, release, nil
}
