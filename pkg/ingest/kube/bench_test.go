package kube_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// BenchmarkIngestFromKubernetes measures the time and memory to ingest
// 2,000 Services with 20,000 endpoints (one EndpointSlice of 10 per
// Service) from a real apiserver into etcd: from the source's start to the
// last object in the store. The store is the apiserver's own etcd process,
// so the heap measured is the ingester's alone. Run it with
// `make bench-ingest`.
func BenchmarkIngestFromKubernetes(b *testing.B) {
	const services, perService = 2000, 10
	b.StopTimer() // only the ingest is timed, not creating the objects
	kc := kubetest.Get(b)
	ns := kc.Namespace(b, nil)
	ctx := context.Background()
	createServices(b, kc, ns, services, perService)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{kc.Etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()

	for i := range b.N {
		cluster := fmt.Sprintf("bench%d", i)
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		st := store.New(cli)
		syncer, err := ingest.NewSyncer(ingest.Config{Source: kube.SourceName(cluster), Store: st})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan ingest.Result, 1)
		src, err := kube.New(kube.Config{Cluster: cluster, Client: kc.Client, Dynamic: kc.Dynamic, Syncer: syncer,
			OnSynced: func(r ingest.Result) {
				select {
				case done <- r:
				default:
				}
			}})
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		stopped := make(chan error, 1)
		start := time.Now()
		b.StartTimer()
		go func() { stopped <- src.Run(rctx) }()
		res := <-done
		b.StopTimer()
		took := time.Since(start)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		runtime.GC()
		var settled runtime.MemStats
		runtime.ReadMemStats(&settled)

		// Then one endpoint change in the synced mesh: from the API write to
		// the store write.
		es, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "svc-0000", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		es.Endpoints = es.Endpoints[:len(es.Endpoints)-1]
		changed, cpu := time.Now(), testutil.CPUTime()
		if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		var change ingest.Result
		for change = range done {
			if change.Written > 0 {
				break
			}
		}
		changeTook, changeCPU := time.Since(changed), testutil.CPUTime()-cpu
		cancel()
		<-stopped
		b.ReportMetric(changeTook.Seconds(), "s/endpoint-change")
		b.ReportMetric(float64(changeCPU)/float64(time.Millisecond), "cpu-ms/endpoint-change")
		b.Logf("one endpoint change reached etcd in %s using %s of CPU (%d written, %d unchanged)",
			changeTook.Round(time.Millisecond), changeCPU.Round(100*time.Microsecond), change.Written, change.Unchanged)
		b.ReportMetric(took.Seconds(), "s/ingest")
		b.ReportMetric(float64(settled.HeapInuse-before.HeapInuse)/(1<<20), "MB-heap-after-GC")
		b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), "MB-allocated")
		b.Logf("cluster %s: %d objects written in %s; heap in use after GC grew %.1f MB; %.0f MB allocated",
			cluster, res.Written, took.Round(time.Millisecond), float64(settled.HeapInuse-before.HeapInuse)/(1<<20),
			float64(after.TotalAlloc-before.TotalAlloc)/(1<<20))
	}
}

// createServices creates services Services with an EndpointSlice of
// perService endpoints each, 32 at a time.
func createServices(b *testing.B, kc *kubetest.Cluster, ns string, services, perService int) {
	ctx := context.Background()
	setup := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, 1)
	for i := range services {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := fmt.Sprintf("svc-%04d", i)
			if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
			}, metav1.CreateOptions{}); err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			es := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
			}
			for j := range perService {
				es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", i/250, i%250, j+1)},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				})
			}
			if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.Logf("created %d Services and %d endpoints in the apiserver in %s", services, services*perService, time.Since(setup).Round(time.Millisecond))
}
