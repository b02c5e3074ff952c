package trust

import (
	"context"
	"errors"
	"log/slog"
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
// lineage. The publishers record it on their Lease (Mark) before they
// write, and annotate what they write with it, so that a replica whose CA
// state is older than the one last published (its store lags, or it
// cannot use the newest state: keymgr.Follower refused it), or of another
// lineage (a state bootstrapped anew), does not write its bundle over the
// published one while it leads: workloads would lose trust in a root that
// signs, or is about to.
type BundleVersion struct {
	Lineage  string
	Sequence uint64
}

// Annotations that carry a BundleVersion: on the publishers' Lease, the
// record (Mark); on a published ConfigMap or ClusterTrustBundle, for
// people and tools (the publishers never read them back: whoever may edit
// a ConfigMap may write them).
const (
	AnnotationLineage  = "meshca.io/bundle-lineage"
	AnnotationSequence = "meshca.io/bundle-sequence"
)

// ResultStale is a write not made: the Mark refused this replica's
// bundle (a newer one of its lineage is published, or one of another
// lineage).
const ResultStale = "stale"

// IsZero reports whether v is no comparable version: without a lineage
// (pinned anchors; a plugged-in directory, whose sequence each process
// counts alone), whatever its sequence.
func (v BundleVersion) IsZero() bool { return v.Lineage == "" }

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

// ErrStale matches what a publisher's Run returns (a *PublishedError)
// when the published bundle is newer than this replica's, or of another
// CA state: the replica steps down, so that one whose CA state is current
// takes the Lease (and publishes, in new namespaces too), and campaigns
// again later.
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

// guard asks m whether v may be written, before a write: nil lets it go
// on. A refusal is counted as ResultStale, said once per version (with
// attrs), and tells Run to step down unless this replica catches up; the
// write is then not made (ok false, nil). Another error is returned: try
// again later.
func (w *staleWarning) guard(ctx context.Context, m *Mark, v BundleVersion, log *slog.Logger, observe func(string), attrs ...any) (ok bool, err error) {
	err = m.Ensure(ctx, v)
	pe, refused := isPublished(err)
	switch {
	case err == nil:
		return true, nil
	case !refused:
		return false, err
	}
	observe(ResultStale)
	if w.first(v) {
		log.Warn(pe.Error(), append(attrs, logLineage, v.Lineage, logSequence, v.Sequence,
			logPublishedLineage, pe.Published.Lineage, logPublishedSequence, pe.Published.Sequence)...)
	}
	return false, nil
}

// watch is a publisher's Run loop once its workers run: it blocks until
// ctx ends (nil), or until the publisher, refused, still is after
// StaleGrace: then it returns the Mark's refusal of bundle's version,
// asked afresh (a *PublishedError, which is ErrStale: it steps down). A
// publisher no longer refused (or whose Lease could not be read, which
// the next write finds out) is re-armed and looks at everything again
// (recheck).
func (w *staleWarning) watch(ctx context.Context, m *Mark, bundle func() Bundle, recheck func()) error {
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
		if pe, refused := isPublished(m.Recheck(ctx, bundle().Version)); refused {
			return pe
		}
		w.rearm()
		recheck()
	}
}
