package trust

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"
)

// Bundle is a trust bundle to publish and its place in the history of the
// CA state it was taken from.
type Bundle struct {
	// PEM is the bundle's roots; nothing is written while it is empty.
	PEM []byte
	// Version is zero for a bundle with no history (pinned trust
	// anchors): it is then written whatever is published.
	Version BundleVersion
}

// BundleVersion places a bundle in its CA state's history: Lineage names
// the state (the ID of its first authority, which no rotation step
// changes) and Sequence, which only grows, orders the bundles of one
// lineage. The publishers annotate what they write with it, so that a
// replica whose CA state is older than the one last published (its store
// lags, or it cannot use the newest state: keymgr.Follower refused it)
// does not write its older bundle over the newer one while it leads:
// workloads would lose trust in a root that is about to sign, or signs
// already.
type BundleVersion struct {
	Lineage  string
	Sequence uint64
}

// Annotations of a published ConfigMap or ClusterTrustBundle that carry
// its BundleVersion.
const (
	AnnotationLineage  = "meshca.io/bundle-lineage"
	AnnotationSequence = "meshca.io/bundle-sequence"
)

// ResultStale is a write not made: the published bundle is newer than
// this replica's (the same lineage, a higher sequence).
const ResultStale = "stale"

// StaleMessage is the log line of a replica that writes nothing because
// the published bundle is newer than its own; it names the way out for an
// operator who restarted the servers on an older CA state on purpose
// (docs/rotation.md).
const StaleMessage = "the published trust bundle is newer than this replica's CA state; not writing over it until this replica catches up " +
	"(to go back to an older state on purpose, remove the annotation " + AnnotationSequence + " from the published objects)"

// IsZero reports whether v is no comparable version: without a lineage
// (pinned anchors; a plugged-in directory, whose sequence each process
// counts alone), whatever its sequence.
func (v BundleVersion) IsZero() bool { return v.Lineage == "" }

// publishedNewer returns the sequence of the bundle annotations describe,
// and whether it is newer than v: of v's lineage, with a higher sequence.
// A bundle of another lineage (the CA state was replaced) or with no
// version is not newer: v's bundle is written over it.
func (v BundleVersion) publishedNewer(annotations map[string]string) (uint64, bool) {
	if v.IsZero() || annotations[AnnotationLineage] != v.Lineage {
		return 0, false
	}
	seq, err := strconv.ParseUint(annotations[AnnotationSequence], 10, 64)
	return seq, err == nil && seq > v.Sequence
}

// annotated reports whether annotations already carry v (none of them
// when v is zero).
func (v BundleVersion) annotated(annotations map[string]string) bool {
	lineage, hasLineage := annotations[AnnotationLineage]
	seq, hasSeq := annotations[AnnotationSequence]
	if v.IsZero() {
		return !hasLineage && !hasSeq
	}
	return lineage == v.Lineage && seq == strconv.FormatUint(v.Sequence, 10)
}

// annotate sets v's annotations in a (removes them for a zero v), which
// may be nil, and returns it.
func (v BundleVersion) annotate(a map[string]string) map[string]string {
	if v.IsZero() {
		delete(a, AnnotationLineage)
		delete(a, AnnotationSequence)
		return a
	}
	if a == nil {
		a = map[string]string{}
	}
	a[AnnotationLineage] = v.Lineage
	a[AnnotationSequence] = strconv.FormatUint(v.Sequence, 10)
	return a
}

// newestSeen knows the versions the published ConfigMaps carry, as the
// informer shows them, so that a replica behind the newest of its lineage
// creates no object in a new namespace either.
type newestSeen struct {
	mu   sync.Mutex
	byNS map[string]BundleVersion
	// newest is the highest sequence of each lineage; nil when byNS
	// changed since it was computed.
	newest map[string]uint64
}

// see records the version the ConfigMap of namespace ns carries (none:
// the annotations were removed).
func (n *newestSeen) see(ns string, annotations map[string]string) {
	lineage := annotations[AnnotationLineage]
	seq, err := strconv.ParseUint(annotations[AnnotationSequence], 10, 64)
	v, ok := BundleVersion{Lineage: lineage, Sequence: seq}, lineage != "" && err == nil
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byNS == nil {
		n.byNS = map[string]BundleVersion{}
	}
	old, had := n.byNS[ns]
	if ok {
		n.byNS[ns] = v
	} else {
		delete(n.byNS, ns)
	}
	switch {
	case n.newest == nil: // computed when next asked
	case had && (!ok || v.Lineage != old.Lineage || v.Sequence < old.Sequence) && old.Sequence >= n.newest[old.Lineage]:
		// The newest may have gone (annotations removed): count again
		// when next asked. A rollout only raises sequences, and costs
		// nothing here.
		n.newest = nil
	case ok:
		n.newest[v.Lineage] = max(n.newest[v.Lineage], v.Sequence)
	}
}

// forget drops namespace ns's ConfigMap, deleted.
func (n *newestSeen) forget(ns string) { n.see(ns, nil) }

// newer returns the highest sequence published of v's lineage, and
// whether it is above v's.
func (n *newestSeen) newer(v BundleVersion) (uint64, bool) {
	if v.IsZero() {
		return 0, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.newest == nil {
		n.newest = map[string]uint64{}
		for _, pv := range n.byNS {
			n.newest[pv.Lineage] = max(n.newest[pv.Lineage], pv.Sequence)
		}
	}
	seq := n.newest[v.Lineage]
	return seq, seq > v.Sequence
}

// ErrStale is what a publisher's Run returns when it found the published
// bundle newer than this replica's: the replica steps down, so that one
// whose CA state is current takes the Lease (and publishes, in new
// namespaces too), and campaigns again later.
var ErrStale = errors.New("trust: the published trust bundle is newer than this replica's CA state")

// StaleGrace is how long a publisher that found the published bundle
// newer than its own waits, for its replica's CA state to catch up (a
// follower a look behind a rotation step), before it steps down.
const StaleGrace = 5 * time.Second

// staleWarning says once per version of this replica's bundle that it is
// older than the one published, however many objects it finds so, and
// tells Run (signal) to step down unless it catches up within StaleGrace.
type staleWarning struct {
	mu     sync.Mutex
	said   BundleVersion
	found  chan struct{}
	closed bool
}

func newStaleWarning() staleWarning { return staleWarning{found: make(chan struct{})} }

// first reports whether v's staleness has not been said yet, and signals
// Run.
func (w *staleWarning) first(v BundleVersion) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		close(w.found)
		w.closed = true
	}
	if w.said == v {
		return false
	}
	w.said = v
	return true
}

// signal is closed once a publisher has found itself behind.
func (w *staleWarning) signal() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.found
}

// rearm is called when the replica caught up after all.
func (w *staleWarning) rearm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		w.found, w.closed = make(chan struct{}), false
	}
}

// watch is a publisher's Run loop once its workers run: it blocks until
// ctx ends (nil), or until the publisher, found behind, still is after
// StaleGrace (ErrStale: it steps down). A publisher that caught up is
// re-armed and looks at everything again (recheck).
func (w *staleWarning) watch(ctx context.Context, behind func() bool, recheck func()) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.signal():
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(StaleGrace):
		}
		if behind() {
			return ErrStale
		}
		w.rearm()
		recheck()
	}
}
