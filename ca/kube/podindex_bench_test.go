package kube

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fullPod is a Pod as the apiserver sends it, with the labels, annotations,
// containers and status that the index's transform throws away.
func fullPod(i int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: fmt.Sprintf("ns-%d", i%500), Name: fmt.Sprintf("app-%d-7d9f8b6c5d-x%05d", i/5, i),
			UID: types.UID(fmt.Sprintf("0b6f3a2e-4c1d-4a7e-9f2b-%012x", i)), ResourceVersion: fmt.Sprint(100000 + i),
			Labels:      map[string]string{"app": fmt.Sprintf("app-%d", i/5), "pod-template-hash": "7d9f8b6c5d", "version": "v1"},
			Annotations: map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z", "sidecar.istio.io/status": `{"initContainers":["istio-init"],"containers":["istio-proxy"]}`},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: fmt.Sprintf("sa-%d", i/5), NodeName: fmt.Sprintf("node-%d", i%1000),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1.2.3", Args: []string{"--port=8080"},
				Env: []corev1.EnvVar{{Name: "POD_NAME", Value: "x"}, {Name: "LOG_LEVEL", Value: "info"}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", HostIP: "192.168.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// BenchmarkPodIndexMemory reports the heap the Pod index holds for 100,000
// Pods (goal: under 50 MB) and the cost of one (namespace, service
// account, node) lookup among them. Its ns/op means nothing. The Pods are
// added as the informer adds them: to its store, then to the account
// index through the event handler.
func BenchmarkPodIndexMemory(b *testing.B) {
	const pods = 100_000
	// A client that is never contacted: the index is filled directly.
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		b.Fatal(err)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	x, err := NewPodIndex(PodIndexConfig{Client: client})
	if err != nil {
		b.Fatal(err)
	}
	store := x.informer.GetIndexer()
	for i := range pods {
		slim, _ := slimPod(fullPod(i))
		if err := store.Add(slim); err != nil {
			b.Fatal(err)
		}
		x.accounts.add(slim.(*podRecord))
	}
	held := heap() - before
	type key struct{ ns, sa, node string }
	keys := make([]key, 1024)
	for j := range keys {
		k := j * 97 % pods
		keys[j] = key{fmt.Sprintf("ns-%d", k%500), fmt.Sprintf("sa-%d", k/5), fmt.Sprintf("node-%d", k%1000)}
	}
	lookup := func(i int) {
		k := keys[i%len(keys)]
		if len(x.accounts.liveOnNode(k.ns, k.sa, k.node)) == 0 {
			b.Fatalf("lookup %d found nothing", i)
		}
	}
	const lookups = 20_000
	start := time.Now()
	for i := range lookups {
		lookup(i)
	}
	perLookup := time.Since(start) / lookups
	for b.Loop() {
	}
	runtime.KeepAlive(x)
	b.ReportMetric(float64(perLookup.Nanoseconds()), "ns/lookup")
	b.ReportMetric(float64(held)/(1<<20), "MB-heap/100k-pods")
	b.ReportMetric(float64(held)/pods, "B/pod")
}
