package trust_test

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca/trust"
)

// stored is the ConfigMap in ns, as the fake apiserver holds it (read
// without a request, which the tests count).
func stored(client *fake.Clientset, ns string) *corev1.ConfigMap {
	obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), ns, trust.ConfigMapName)
	if err != nil {
		return nil
	}
	return obj.(*corev1.ConfigMap)
}

// onlyBundle reports whether the ConfigMap in ns holds pem under
// root-cert.pem and no other key.
func onlyBundle(client *fake.Clientset, ns, pem string) func() bool {
	return func() bool {
		cm := stored(client, ns)
		return cm != nil && maps.Equal(cm.Data, map[string]string{trust.DataKey: pem}) && len(cm.BinaryData) == 0
	}
}

// TestPublisherOwnsData: the publisher owns the ConfigMap's data. Keys it
// did not write are dropped, whether root-cert.pem is current or not;
// others' labels, annotations, owners and finalizers are kept. Where the
// cache holds all a write keeps, the write is made from it; where others'
// metadata is to be kept, from the object read first.
func TestPublisherOwnsData(t *testing.T) {
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "tenant-root", UID: "u-1"}
	for _, tc := range []struct {
		name     string
		cm       *corev1.ConfigMap
		wantRead bool
	}{
		{"current root, extra keys, others' metadata", &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a",
				Labels:          map[string]string{trust.LabelKey: trust.LabelValue, "tenant": "mine"},
				Annotations:     map[string]string{"tenant": "note"},
				OwnerReferences: []metav1.OwnerReference{owner}, Finalizers: []string{"tenant.example/keep"}},
			Data:       map[string]string{trust.DataKey: "root-1", "pad": strings.Repeat("x", 1<<20)},
			BinaryData: map[string][]byte{"bin": []byte("b")},
		}, true},
		{"stale root, extra keys", &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a",
				Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
			Data: map[string]string{trust.DataKey: "root-0", "extra": "x"},
		}, false},
		{"binary data only", &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a",
				Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
			Data:       map[string]string{trust.DataKey: "root-1"},
			BinaryData: map[string][]byte{"bin": []byte("b")},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(namespace("a", nil, false), tc.cm)
			var reads atomic.Int32
			client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
				reads.Add(1)
				return false, nil, nil
			})
			obs := &counter{}
			start(t, trust.Config{Client: client, Bundle: pemOnly("root-1"), Observer: obs})
			eventually(t, "data rewritten with root-cert.pem only", onlyBundle(client, "a", "root-1"))
			time.Sleep(200 * time.Millisecond) // a second write would show by now
			if n := obs.get(trust.ResultUpdated); n != 1 {
				t.Errorf("%d updates, want 1", n)
			}
			if got := reads.Load() > 0; got != tc.wantRead {
				t.Errorf("read before the write: %v, want %v", got, tc.wantRead)
			}
			got := stored(client, "a")
			if !maps.Equal(got.Labels, tc.cm.Labels) {
				t.Errorf("labels %v, want %v", got.Labels, tc.cm.Labels)
			}
			if !maps.Equal(got.Annotations, tc.cm.Annotations) {
				t.Errorf("annotations %v, want %v", got.Annotations, tc.cm.Annotations)
			}
			if !slices.Equal(got.OwnerReferences, tc.cm.OwnerReferences) || !slices.Equal(got.Finalizers, tc.cm.Finalizers) {
				t.Errorf("owners %v, finalizers %v; want %v, %v", got.OwnerReferences, got.Finalizers,
					tc.cm.OwnerReferences, tc.cm.Finalizers)
			}
		})
	}
}
