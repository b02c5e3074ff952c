package trust

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Mark records the newest bundle version published, on the Lease the
// publishers are elected on: an object in meshca's own namespace, which
// tenants may not write (meshca's replicas may, and whoever the cluster's
// RBAC lets write Leases there: its operators, istiod when it shares the
// namespace), unlike the ConfigMaps it publishes, which anyone who may
// edit ConfigMaps in their namespace can annotate.
// A publisher records a version there before it writes an object with it,
// and writes nothing while the record holds a newer version of its
// lineage, or a version of another lineage: one CA state's bundle never
// replaces another's unless an operator removes the record
// (docs/rotation.md). Both publishers of a term share one Mark.
type Mark struct {
	Client kubernetes.Interface
	// Namespace and Name name the Lease.
	Namespace, Name string

	mu       sync.Mutex
	recorded BundleVersion   // what this Mark last read or wrote there
	refused  *PublishedError // its last refusal, answered again until Recheck
}

// markCallTimeout bounds each read or write of the Lease.
const markCallTimeout = 10 * time.Second

// maxMarkConflicts bounds the compare-and-swap retries of one Ensure
// against the elector's own renewals of the Lease.
const maxMarkConflicts = 5

// PublishedError is a bundle version a Mark refuses: the record holds a
// newer one of its lineage, or one of another lineage.
type PublishedError struct {
	Ours, Published BundleVersion
	// Lease is the namespace/name of the record.
	Lease string
}

func (e *PublishedError) Error() string {
	if e.OtherLineage() {
		return fmt.Sprintf("trust: the published trust bundle belongs to another CA state (lineage %s; this replica's is %s): "+
			"not replacing it, as workloads hold certificates under its roots "+
			"(to publish this state's bundle on purpose, remove the annotations %s and %s from the Lease %s)",
			e.Published.Lineage, e.Ours.Lineage, AnnotationLineage, AnnotationSequence, e.Lease)
	}
	return fmt.Sprintf("trust: the published trust bundle (sequence %d) is newer than this replica's CA state (sequence %d); "+
		"not writing over it until this replica catches up (to go back to an older state on purpose, remove the annotation %s from the Lease %s)",
		e.Published.Sequence, e.Ours.Sequence, AnnotationSequence, e.Lease)
}

// OtherLineage reports whether the record is of another CA state.
func (e *PublishedError) OtherLineage() bool { return e.Published.Lineage != e.Ours.Lineage }

// Is makes errors.Is(err, ErrStale) hold.
func (e *PublishedError) Is(target error) bool { return target == ErrStale }

// Ensure records v as published unless the record refuses it
// (*PublishedError); call it before writing an object with v, or, at
// least once a term, finding nothing to write (the record then follows
// what is published). A zero v (no history: pinned anchors, a plugged-in
// directory) is neither checked nor recorded. Another error (the
// apiserver) means: try again later. Once v is recorded, or refused,
// Ensure answers without asking the apiserver.
func (m *Mark) Ensure(ctx context.Context, v BundleVersion) error { return m.ensure(ctx, v, false) }

// Recheck is Ensure, reading the record again when it refused v before:
// it may have been removed, or this replica caught up.
func (m *Mark) Recheck(ctx context.Context, v BundleVersion) error { return m.ensure(ctx, v, true) }

func (m *Mark) ensure(ctx context.Context, v BundleVersion, fresh bool) error {
	if m == nil || v.IsZero() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.recorded == v:
		return nil
	case !fresh && m.refused != nil && m.refused.Ours == v:
		return m.refused
	}
	m.recorded, m.refused = BundleVersion{}, nil
	leases := m.Client.CoordinationV1().Leases(m.Namespace)
	for range maxMarkConflicts {
		gctx, cancel := context.WithTimeout(ctx, markCallTimeout)
		lease, err := leases.Get(gctx, m.Name, metav1.GetOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("trust: read the published version from Lease %s/%s: %w", m.Namespace, m.Name, err)
		}
		published, ok := recordedVersion(lease.Annotations)
		switch {
		case ok && (published.Lineage != v.Lineage || published.Sequence > v.Sequence):
			m.refused = &PublishedError{Ours: v, Published: published, Lease: m.Namespace + "/" + m.Name}
			return m.refused
		case ok && published == v:
			m.recorded = v
			return nil
		}
		lease.Annotations = v.annotate(lease.Annotations)
		uctx, cancel := context.WithTimeout(ctx, markCallTimeout)
		_, err = leases.Update(uctx, lease, metav1.UpdateOptions{})
		cancel()
		switch {
		case err == nil:
			m.recorded = v
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("trust: record the published version on Lease %s/%s: %w", m.Namespace, m.Name, err)
		}
	}
	return fmt.Errorf("trust: record the published version on Lease %s/%s: %d conflicts in a row", m.Namespace, m.Name, maxMarkConflicts)
}

// recordedVersion reads a version from annotations; ok is false when
// there is no lineage (never recorded, or removed by an operator: any
// state may publish). A lineage without a readable sequence (removed by
// an operator) is sequence 0: any state of that lineage, an older one
// too, may publish; another lineage may not.
func recordedVersion(annotations map[string]string) (BundleVersion, bool) {
	lineage := annotations[AnnotationLineage]
	if lineage == "" {
		return BundleVersion{}, false
	}
	seq, _ := strconv.ParseUint(annotations[AnnotationSequence], 10, 64)
	return BundleVersion{Lineage: lineage, Sequence: seq}, true
}

// isPublished reports whether err is a Mark's refusal.
func isPublished(err error) (*PublishedError, bool) {
	var pe *PublishedError
	return pe, errors.As(err, &pe)
}
