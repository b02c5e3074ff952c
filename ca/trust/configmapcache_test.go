package trust

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// paddedConfigMap is a tenant's istio-ca-root-cert: the current bundle,
// and a megabyte of its own in every place it may write.
func paddedConfigMap(ns, pem string) *corev1.ConfigMap {
	big := strings.Repeat("x", 1<<20)
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: ns, ResourceVersion: "7",
			Labels:      map[string]string{LabelKey: LabelValue, "tenant": "mine"},
			Annotations: map[string]string{"tenant": strings.Repeat("a", 200<<10)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "tenant",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:pad":{}}, "x": "` + strings.Repeat("m", 64<<10) + `"}`)}}},
		},
		Data:       map[string]string{DataKey: pem, "pad": big},
		BinaryData: map[string][]byte{"bin": []byte(big[:64<<10])},
	}
}

// TestConfigMapCacheHoldsOnlyComparedFields: the informer keeps of a
// padded ConfigMap (1 MiB of data, 200 KiB of annotations, 64 KiB of
// binary data and of managed fields) only what the publisher compares,
// a few hundred bytes, whatever it may write.
func TestConfigMapCacheHoldsOnlyComparedFields(t *testing.T) {
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, paddedConfigMap("a", "root-1"))
	// Refused writes leave the padded ConfigMap in place, as an RBAC
	// without update would.
	client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, ConfigMapName, nil)
	})
	p, err := NewPublisher(Config{Client: client, Bundle: func() Bundle { return Bundle{PEM: []byte("root-1")} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for !p.cmInformer.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatal("the ConfigMap informer did not sync within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cached, err := p.configMaps.ConfigMaps("a").Get(ConfigMapName)
	if err != nil {
		t.Fatal(err)
	}
	if size := cached.Size(); size > 2<<10 {
		t.Errorf("the cache holds %d bytes of a padded ConfigMap, want under 2 KiB", size)
	}
	if cached.Labels[LabelKey] != LabelValue || cached.ResourceVersion != "7" {
		t.Errorf("the cache lost a compared field: labels %v, resourceVersion %q", cached.Labels, cached.ResourceVersion)
	}
}

func TestSummarize(t *testing.T) {
	v := BundleVersion{Lineage: "lin", Sequence: 3}
	ours := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: "a", UID: "u", ResourceVersion: "9",
				Labels: map[string]string{LabelKey: LabelValue}, Annotations: v.annotate(nil)},
			Data: map[string]string{DataKey: "root-1"},
		}
	}
	for _, tc := range []struct {
		name                     string
		edit                     func(*corev1.ConfigMap)
		foreignData, foreignMeta bool
		digestOf                 string // "-": no digest
	}{
		{"as meshca writes it", func(*corev1.ConfigMap) {}, false, false, "root-1"},
		{"no root-cert.pem", func(cm *corev1.ConfigMap) { cm.Data = nil }, false, false, "-"},
		{"another data key", func(cm *corev1.ConfigMap) { cm.Data["pad"] = "x" }, true, false, "root-1"},
		{"binary data", func(cm *corev1.ConfigMap) { cm.BinaryData = map[string][]byte{"b": nil} }, true, false, "root-1"},
		{"an over-long lineage", func(cm *corev1.ConfigMap) { cm.Annotations[AnnotationLineage] = strings.Repeat("l", 257) }, true, false, "root-1"},
		{"others' label", func(cm *corev1.ConfigMap) { cm.Labels["tenant"] = "x" }, false, true, "root-1"},
		{"others' annotation", func(cm *corev1.ConfigMap) { cm.Annotations["tenant"] = "x" }, false, true, "root-1"},
		{"an owner", func(cm *corev1.ConfigMap) { cm.OwnerReferences = []metav1.OwnerReference{{Name: "o"}} }, false, true, "root-1"},
		{"a finalizer", func(cm *corev1.ConfigMap) { cm.Finalizers = []string{"f"} }, false, true, "root-1"},
		{"generateName", func(cm *corev1.ConfigMap) { cm.GenerateName = "g-" }, false, true, "root-1"},
		{"the cache's annotations, written by a tenant", func(cm *corev1.ConfigMap) {
			cm.Data = nil
			cm.Annotations[cacheRootDigest] = digest([]byte("root-1"))
		}, false, true, "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm := ours()
			tc.edit(cm)
			obj, err := RootCertDocument.summarize(cm)
			if err != nil {
				t.Fatal(err)
			}
			s := obj.(*corev1.ConfigMap)
			if got := s.Annotations[cacheForeignData] != ""; got != tc.foreignData {
				t.Errorf("foreign data %v, want %v", got, tc.foreignData)
			}
			if got := s.Annotations[cacheForeignMeta] != ""; got != tc.foreignMeta {
				t.Errorf("foreign metadata %v, want %v", got, tc.foreignMeta)
			}
			got, ok := s.Annotations[cacheRootDigest]
			switch {
			case tc.digestOf == "-" && ok:
				t.Errorf("digest %s of no root-cert.pem", got)
			case tc.digestOf != "-" && got != digest([]byte(tc.digestOf)):
				t.Errorf("digest %q, want that of %q", got, tc.digestOf)
			}
			if s.Data != nil || s.BinaryData != nil || len(s.Labels) > 1 || s.Name != ConfigMapName || s.Namespace != "a" ||
				s.UID != "u" || s.ResourceVersion != "9" || s.OwnerReferences != nil || s.Finalizers != nil {
				t.Errorf("summary %+v", s)
			}
			again, _ := RootCertDocument.summarize(s)
			if again != obj {
				t.Error("a summary was summarized again")
			}
		})
	}
}

func TestCurrentAndWritten(t *testing.T) {
	b := Bundle{PEM: []byte("root-2"), Version: BundleVersion{Lineage: "lin", Sequence: 4}}
	live := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName, Namespace: "a", UID: "u", ResourceVersion: "9",
			Labels:      map[string]string{LabelKey: LabelValue, "tenant": "x"},
			Annotations: map[string]string{"tenant": "y"}, Finalizers: []string{"f"}},
		Data:       map[string]string{DataKey: "root-2", "pad": "x"},
		BinaryData: map[string][]byte{"b": nil},
	}
	obj, _ := RootCertDocument.summarize(live)
	s := obj.(*corev1.ConfigMap)
	if current(s, b) {
		t.Error("current with foreign data and no version annotations")
	}
	for name, base := range map[string]*corev1.ConfigMap{"from the summary": s, "from the object": live} {
		t.Run(name, func(t *testing.T) {
			w := RootCertDocument.written(base, b)
			if len(w.Data) != 1 || w.Data[DataKey] != "root-2" || w.BinaryData != nil {
				t.Errorf("data %v, binaryData %v", w.Data, w.BinaryData)
			}
			if w.ResourceVersion != "9" || w.UID != "u" || w.Labels[LabelKey] != LabelValue || !b.Version.annotated(w.Annotations) {
				t.Errorf("metadata %+v", w.ObjectMeta)
			}
			for k := range w.Annotations {
				if strings.HasPrefix(k, "cache.meshca.io/") {
					t.Errorf("the cache's annotation %s written", k)
				}
			}
			if keeps := w.Labels["tenant"] == "x" && w.Annotations["tenant"] == "y" && len(w.Finalizers) == 1; keeps != (base == live) {
				t.Errorf("others' metadata kept: %v", keeps)
			}
			obj, _ := RootCertDocument.summarize(w)
			if !current(obj.(*corev1.ConfigMap), b) {
				t.Error("what is written is not current")
			}
		})
	}
}
