package trust

import (
	"crypto/sha256"
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The ConfigMap informer keeps a summary of each ConfigMap of its
// Document (istio-ca-root-cert, istio-ca-crl), of a
// size no tenant can change: a tenant may write a megabyte of data into
// its namespace's ConfigMap, and 256 KiB of annotations, and kept whole a
// few hundred such would fill the leader's heap (the gRPC CA's too: it is
// the same process). The summary is a ConfigMap that holds what reconcile
// compares, and what the transform found in the rest, as annotations of
// the cache's own:
//
//   - name, namespace, UID, resource version, immutable (a write made
//     from the summary carries them);
//   - the label istio.io/config and meshca's version annotations, when
//     present (a value of the latter longer than meshca ever writes
//     counts as foreign data instead: it is rewritten);
//   - cacheRootDigest: the SHA-256 of the document's key (root-cert.pem,
//     ca-crl.pem), however long it is;
//   - cacheForeignData: the ConfigMap holds data meshca does not write
//     (another key, binaryData): reconcile rewrites it;
//   - cacheForeignMeta: the ConfigMap holds others' metadata (labels,
//     annotations, owner references, finalizers, generateName), which a
//     write keeps: it is then made from the object read afresh.
//
// managedFields are dropped: an update without them keeps the server's.
const (
	cacheAPIVersion  = "cache.meshca.io/v1"
	cacheKind        = "ConfigMapSummary"
	cacheRootDigest  = "cache.meshca.io/root-cert-sha256"
	cacheForeignData = "cache.meshca.io/foreign-data"
	cacheForeignMeta = "cache.meshca.io/foreign-metadata"
	// maxVersionValue is the longest value of meshca's annotations kept;
	// it writes a lineage (an authority ID) and a decimal sequence.
	maxVersionValue = 256
)

// summarize is the ConfigMap informer's transform (cache.TransformFunc):
// it replaces a ConfigMap of d by its summary. A summary is returned as
// it is: its apiVersion, which the apiserver never serves, tells it
// apart, so nobody who may write a ConfigMap can make it pass for one.
func (d Document) summarize(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm.APIVersion == cacheAPIVersion {
		return obj, nil
	}
	s := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: cacheAPIVersion, Kind: cacheKind},
		ObjectMeta: metav1.ObjectMeta{Name: cm.Name, Namespace: cm.Namespace, UID: cm.UID,
			ResourceVersion: cm.ResourceVersion, Annotations: map[string]string{}},
		Immutable: cm.Immutable,
	}
	foreignData := len(cm.BinaryData) > 0
	for k, v := range cm.Data {
		if k == d.Key {
			s.Annotations[cacheRootDigest] = digest([]byte(v))
		} else {
			foreignData = true
		}
	}
	if v, ok := cm.Labels[LabelKey]; ok {
		s.Labels = map[string]string{LabelKey: v} // label values are 63 bytes at most
	}
	foreignMeta := len(cm.Labels) > len(s.Labels) || len(cm.OwnerReferences) > 0 ||
		len(cm.Finalizers) > 0 || cm.GenerateName != ""
	for k, v := range cm.Annotations {
		switch {
		case k != AnnotationLineage && k != AnnotationSequence:
			foreignMeta = true
		case len(v) > maxVersionValue:
			foreignData = true
		default:
			s.Annotations[k] = v
		}
	}
	if foreignData {
		s.Annotations[cacheForeignData] = "true"
	}
	if foreignMeta {
		s.Annotations[cacheForeignMeta] = "true"
	}
	return s, nil
}

// digest is the hex SHA-256 of b.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// current reports whether the ConfigMap s summarizes is what meshca
// writes for bundle: d's key alone, the bundle's, with the Istio label
// and the bundle version's annotations.
func current(s *corev1.ConfigMap, bundle Bundle) bool {
	return s.Annotations[cacheForeignData] == "" && s.Annotations[cacheRootDigest] == digest(bundle.PEM) &&
		s.Labels[LabelKey] == LabelValue && bundle.Version.annotated(s.Annotations)
}

// written is what meshca writes over base, a ConfigMap of d read afresh
// or a summary without others' metadata: base's metadata (only that of
// the write's target, from a summary), the Istio label and the bundle
// version's annotations, and data of the bundle alone, under d's key.
// Data is meshca's: a key it did not write is dropped (Istio's namespace
// controller keeps them; it also caches them whole).
func (d Document) written(base *corev1.ConfigMap, bundle Bundle) *corev1.ConfigMap {
	meta := metav1.ObjectMeta{Name: base.Name, Namespace: base.Namespace, UID: base.UID, ResourceVersion: base.ResourceVersion}
	if base.APIVersion != cacheAPIVersion {
		meta = *base.ObjectMeta.DeepCopy()
	}
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	meta.Labels[LabelKey] = LabelValue
	meta.Annotations = bundle.Version.annotate(meta.Annotations)
	return &corev1.ConfigMap{ObjectMeta: meta, Immutable: base.Immutable,
		Data: map[string]string{d.Key: string(bundle.PEM)}}
}
