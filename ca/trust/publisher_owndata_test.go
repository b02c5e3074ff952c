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

// stored is the ConfigMap of d in ns, as the fake apiserver holds it
// (read without a request, which the tests count).
func stored(client *fake.Clientset, d trust.Document, ns string) *corev1.ConfigMap {
	obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), ns, d.Name)
	if err != nil {
		return nil
	}
	return obj.(*corev1.ConfigMap)
}

// onlyBundle reports whether the ConfigMap of d in ns holds pem under
// d's key and no other key.
func onlyBundle(client *fake.Clientset, d trust.Document, ns, pem string) func() bool {
	return func() bool {
		cm := stored(client, d, ns)
		return cm != nil && maps.Equal(cm.Data, map[string]string{d.Key: pem}) && len(cm.BinaryData) == 0
	}
}

// asDocument is cm, written by a tenant, as a ConfigMap of d: its name
// and d's key in place of root-cert.pem.
func asDocument(cm *corev1.ConfigMap, d trust.Document) *corev1.ConfigMap {
	cm = cm.DeepCopy()
	cm.Name = d.Name
	if v, ok := cm.Data[trust.DataKey]; ok {
		delete(cm.Data, trust.DataKey)
		cm.Data[d.Key] = v
	}
	return cm
}

// TestPublisherOwnsData: the publisher owns the ConfigMap's data, of
// either document. Keys it did not write are dropped, whether its own key
// is current or not;
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
		for _, d := range []trust.Document{trust.RootCertDocument, trust.CRLDocument} {
			t.Run(d.Name+"/"+tc.name, func(t *testing.T) { ownsData(t, d, asDocument(tc.cm, d), tc.wantRead) })
		}
	}
}

func ownsData(t *testing.T, d trust.Document, cm *corev1.ConfigMap, wantRead bool) {
	client := fake.NewClientset(namespace("a", nil, false), cm)
	var reads atomic.Int32
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		reads.Add(1)
		return false, nil, nil
	})
	obs := &counter{}
	start(t, trust.Config{Client: client, Document: d, Bundle: pemOnly("root-1"), Observer: obs})
	eventually(t, "data rewritten with its key only", onlyBundle(client, d, "a", "root-1"))
	time.Sleep(200 * time.Millisecond) // a second write would show by now
	if n := obs.get(trust.ResultUpdated); n != 1 {
		t.Errorf("%d updates, want 1", n)
	}
	if got := reads.Load() > 0; got != wantRead {
		t.Errorf("read before the write: %v, want %v", got, wantRead)
	}
	got := stored(client, d, "a")
	if !maps.Equal(got.Labels, cm.Labels) {
		t.Errorf("labels %v, want %v", got.Labels, cm.Labels)
	}
	if !maps.Equal(got.Annotations, cm.Annotations) {
		t.Errorf("annotations %v, want %v", got.Annotations, cm.Annotations)
	}
	if !slices.Equal(got.OwnerReferences, cm.OwnerReferences) || !slices.Equal(got.Finalizers, cm.Finalizers) {
		t.Errorf("owners %v, finalizers %v; want %v, %v", got.OwnerReferences, got.Finalizers,
			cm.OwnerReferences, cm.Finalizers)
	}
}
