package kube

import (
	"encoding/hex"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// podRecord is what the index keeps of a Pod: its name, UID and resource
// version, and the three facts authorization reads, so that 100,000 Pods
// fit in a small heap. Namespace, service account and node names are
// interned (unique.Handle: one copy of each name, 8 bytes a record), and
// a UID, a UUID, is kept as its 16 bytes. A record never changes once
// made: an update replaces it.
type podRecord struct {
	namespace, serviceAccount, node unique.Handle[string]
	name, resourceVersion           string
	uid                             uuid
	// uidText is the UID when it is not a UUID in the canonical form the
	// apiserver writes (never, from a real one); nil otherwise.
	uidText              *string
	terminated, deleting bool
}

// slimPod is the informer's transform: it replaces a Pod by its podRecord.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	r := &podRecord{
		namespace: unique.Make(p.Namespace), serviceAccount: unique.Make(p.Spec.ServiceAccountName), node: unique.Make(p.Spec.NodeName),
		name: p.Name, resourceVersion: p.ResourceVersion,
		terminated: terminated(p), deleting: p.DeletionTimestamp != nil,
	}
	var ok2 bool
	if r.uid, ok2 = parseUUID(string(p.UID)); !ok2 {
		text := string(p.UID)
		r.uidText = &text
	}
	return r, nil
}

// UID returns the Pod's UID as the apiserver wrote it.
func (p *podRecord) UID() string {
	if p.uidText != nil {
		return *p.uidText
	}
	return p.uid.String()
}

func (p *podRecord) sameUID(q *podRecord) bool {
	if p.uidText == nil && q.uidText == nil {
		return p.uid == q.uid
	}
	return p.UID() == q.UID()
}

func (p *podRecord) info() *PodInfo {
	return &PodInfo{Namespace: p.namespace.Value(), Name: p.name, UID: p.UID(), ServiceAccount: p.serviceAccount.Value(),
		Node: p.node.Value(), Terminated: p.terminated, Deleting: p.deleting}
}

// GetObjectKind implements runtime.Object.
func (p *podRecord) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject implements runtime.Object; a record is never changed, and
// holds no pointer to anything that is.
func (p *podRecord) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// GetObjectMeta implements metav1.ObjectMetaAccessor, which is how the
// informer's store finds a record's key and resource version: a fresh
// ObjectMeta each time, only on the informer's path, never a request's.
func (p *podRecord) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.namespace.Value(), Name: p.name, UID: types.UID(p.UID()), ResourceVersion: p.resourceVersion}
}

// uuid is a UUID's 16 bytes.
type uuid [16]byte

// parseUUID reads the canonical text form of a UUID, lower-case hex in
// groups of 8-4-4-4-12, which String gives back unchanged.
func parseUUID(s string) (uuid, bool) {
	var u uuid
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	j := 0
	for i := 0; i < 36; {
		if s[i] == '-' {
			i++
			continue
		}
		hi, ok1 := fromHex(s[i])
		lo, ok2 := fromHex(s[i+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[j] = hi<<4 | lo
		i, j = i+2, j+1
	}
	return u, true
}

func fromHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func (u uuid) String() string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}
