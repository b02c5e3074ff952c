package kube

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
)

// Defaults of TokenCacheConfig.
const (
	DefaultTokenCacheTTL  = time.Minute
	DefaultTokenCacheSize = 100_000
	// DefaultNegativeTTL is how long a refused token is refused again
	// without another TokenReview.
	DefaultNegativeTTL = 5 * time.Second
	// maxNegative bounds the refused tokens remembered; the oldest go
	// first, so a flood of garbage tokens cannot grow the heap.
	maxNegative = 10_000
)

// TokenCacheConfig configures a CachedTokenReviewer.
type TokenCacheConfig struct {
	// Reviewer authenticates a token on a miss (a *TokenReviewer).
	Reviewer Reviewer
	// Audiences are part of the cache key: a token reviewed for other
	// audiences is another entry.
	Audiences []string
	// TTL is the longest a positive review is reused; never past the
	// token's own expiry.
	TTL time.Duration
	// MaxEntries bounds the cache; the least recently used entry goes first.
	MaxEntries int
	// NegativeTTL is how long a token the reviewer refused is refused
	// again from the cache, so that a caller repeating a bad token does
	// not spend the apiserver client's rate budget; DefaultNegativeTTL
	// when zero. Unavailable answers are never cached.
	NegativeTTL time.Duration
	Metrics     *TokenCacheMetrics
	// Cluster labels the metrics.
	Cluster string
	Now     func() time.Time
}

// CachedTokenReviewer reuses TokenReview answers. ztunnel sends the same
// token for every Pod on its node, so without a cache the apiserver sees
// one review per certificate. Successes are kept up to TTL; refusals for
// NegativeTTL; concurrent misses for one token share one review; an entry
// dies with its token, after its TTL, or when its bound Pod is deleted or
// replaced. A token bound to a Pod deleted less than TTL ago is refused,
// even when the apiserver, not caught up yet, still accepts it: a review
// in flight when its Pod went, or one from a lagging apiserver replica,
// is neither cached nor believed.
type CachedTokenReviewer struct {
	c       TokenCacheConfig
	flight  singleflight.Group
	mu      sync.Mutex
	entries map[string]*list.Element
	lru     *list.List
	byPod   map[string]map[string]struct{}
	refused map[string]refusal
	fifo    *list.List // keys of refused, oldest first
	// gone records, by Pod UID, when each Pod was deleted, for goneFor;
	// goneOrder holds the same UIDs, oldest first, for pruning.
	gone      map[string]time.Time
	goneOrder *list.List
}

type refusal struct {
	err     error
	expires time.Time
}

type tokenEntry struct {
	key     string
	id      Identity
	expires time.Time
}

// reviewTimeout bounds one TokenReview.
const reviewTimeout = 10 * time.Second

// NewCachedTokenReviewer assembles the cache.
func NewCachedTokenReviewer(c TokenCacheConfig) *CachedTokenReviewer {
	if c.TTL <= 0 {
		c.TTL = DefaultTokenCacheTTL
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultTokenCacheSize
	}
	if c.NegativeTTL <= 0 {
		c.NegativeTTL = DefaultNegativeTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &CachedTokenReviewer{c: c, entries: map[string]*list.Element{}, lru: list.New(), byPod: map[string]map[string]struct{}{},
		refused: map[string]refusal{}, fifo: list.New(), gone: map[string]time.Time{}, goneOrder: list.New()}
}

// Review implements Reviewer.
func (r *CachedTokenReviewer) Review(ctx context.Context, token string) (*Identity, error) {
	key := r.key(token)
	if id, err, ok := r.get(key); ok {
		r.c.Metrics.hit(r.c.Cluster)
		return id, err
	}
	r.c.Metrics.miss(r.c.Cluster)
	// Each waiter stops waiting when its own request ends: the review it
	// shares may outlast a short client deadline.
	ch := r.flight.DoChan(key, func() (any, error) {
		start := r.c.Now()
		// The review serves every waiter, so it must not die with the
		// first caller's context; it gets its own bound instead.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		id, err := r.c.Reviewer.Review(rctx, token)
		r.c.Metrics.observe(r.c.Cluster, r.c.Now().Sub(start))
		if err == nil && r.podGone(id.PodUID) {
			id, err = nil, refused("token_bound_object_gone", tokenMsg,
				fmt.Errorf("the token's Pod %s/%s (UID %s) was deleted; the apiserver has not caught up yet", id.Namespace, id.PodName, id.PodUID))
		}
		switch {
		case err == nil:
			r.put(key, id, tokenExpiry(token))
		case isRefusal(err):
			r.putRefused(key, err)
		}
		return id, err
	})
	var res singleflight.Result
	select {
	case res = <-ch:
	case <-ctx.Done():
		return nil, unavailable("tokenreview_failed", "cannot review the token now, retry later", ctx.Err())
	}
	if res.Err != nil {
		return nil, res.Err
	}
	id := *res.Val.(*Identity)
	return &id, nil
}

// Known reports whether token's identity is in the cache: authenticating
// it costs the apiserver nothing.
func (r *CachedTokenReviewer) Known(token string) bool {
	id, err, ok := r.get(r.key(token))
	return ok && err == nil && id != nil
}

// isRefusal reports whether err is a decided refusal, as opposed to an
// apiserver that could not answer.
func isRefusal(err error) bool {
	var ke *Error
	return errors.As(err, &ke) && !ke.Retry
}

// key hashes the token with the audiences it is reviewed for; the token
// itself is never kept.
func (r *CachedTokenReviewer) key(token string) string {
	h := sha256.New()
	h.Write([]byte(strings.Join(r.c.Audiences, "\x00")))
	h.Write([]byte{0xff})
	h.Write([]byte(token))
	return string(h.Sum(nil))
}

// get returns a cached answer: an identity, or the refusal of a token
// refused less than NegativeTTL ago.
func (r *CachedTokenReviewer) get(key string) (*Identity, error, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.c.Now()
	if ref, ok := r.refused[key]; ok {
		if now.Before(ref.expires) {
			return nil, ref.err, true
		}
		delete(r.refused, key)
	}
	el, ok := r.entries[key]
	if !ok {
		return nil, nil, false
	}
	e := el.Value.(*tokenEntry)
	if !now.Before(e.expires) {
		r.removeLocked(el)
		return nil, nil, false
	}
	r.lru.MoveToFront(el)
	id := e.id
	return &id, nil, true
}

// putRefused remembers a refusal for NegativeTTL, forgetting the oldest
// refusals past maxNegative.
func (r *CachedTokenReviewer) putRefused(key string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.refused[key]; !ok {
		r.fifo.PushBack(key)
	}
	r.refused[key] = refusal{err: err, expires: r.c.Now().Add(r.c.NegativeTTL)}
	for r.fifo.Len() > maxNegative {
		delete(r.refused, r.fifo.Remove(r.fifo.Front()).(string))
	}
	// Keys whose refusal expired and was read are still queued; drop
	// them from the front as they come up.
	for el := r.fifo.Front(); el != nil; el = r.fifo.Front() {
		if _, ok := r.refused[el.Value.(string)]; ok {
			break
		}
		r.fifo.Remove(el)
	}
}

// podGone reports whether the Pod with uid was deleted less than goneFor
// ago.
func (r *CachedTokenReviewer) podGone(uid string) bool {
	if uid == "" {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.gone[uid]
	return ok && r.c.Now().Sub(at) <= r.goneFor()
}

// goneFor is how long a deleted Pod's tokens are refused whatever the
// apiserver says: as long as a positive review may be kept, and at least
// as long as a review may run.
func (r *CachedTokenReviewer) goneFor() time.Duration { return max(r.c.TTL, 2*reviewTimeout) }

// put caches a positive review, unless the Pod its token is bound to was
// deleted (while the review ran).
func (r *CachedTokenReviewer) put(key string, c *Identity, tokenExp time.Time) {
	expires := r.c.Now().Add(r.c.TTL)
	if !tokenExp.IsZero() && tokenExp.Before(expires) {
		expires = tokenExp
	}
	if !r.c.Now().Before(expires) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.gone[c.PodUID]; ok && c.PodUID != "" && r.c.Now().Sub(at) <= r.goneFor() {
		return
	}
	if el, ok := r.entries[key]; ok {
		r.removeLocked(el)
	}
	r.entries[key] = r.lru.PushFront(&tokenEntry{key: key, id: *c, expires: expires})
	if c.PodUID != "" {
		if r.byPod[c.PodUID] == nil {
			r.byPod[c.PodUID] = map[string]struct{}{}
		}
		r.byPod[c.PodUID][key] = struct{}{}
	}
	for r.lru.Len() > r.c.MaxEntries {
		r.removeLocked(r.lru.Back())
	}
}

func (r *CachedTokenReviewer) removeLocked(el *list.Element) {
	e := el.Value.(*tokenEntry)
	r.lru.Remove(el)
	delete(r.entries, e.key)
	if uid := e.id.PodUID; uid != "" {
		delete(r.byPod[uid], e.key)
		if len(r.byPod[uid]) == 0 {
			delete(r.byPod, uid)
		}
	}
}

// InvalidatePod drops every entry for tokens bound to the Pod with uid,
// and refuses such tokens for goneFor: the result of a review still in
// flight, and the answers of an apiserver that has not seen the deletion
// yet, are not believed.
func (r *CachedTokenReviewer) InvalidatePod(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.c.Now()
	if _, ok := r.gone[uid]; !ok {
		r.goneOrder.PushBack(uid)
	}
	r.gone[uid] = now
	for el := r.goneOrder.Front(); el != nil; el = r.goneOrder.Front() {
		u := el.Value.(string)
		if now.Sub(r.gone[u]) <= r.goneFor() {
			break
		}
		delete(r.gone, u)
		r.goneOrder.Remove(el)
	}
	for key := range r.byPod[uid] {
		if el, ok := r.entries[key]; ok {
			r.removeLocked(el)
		}
	}
}

// Len is the number of cached entries.
func (r *CachedTokenReviewer) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lru.Len()
}

// TokenCacheMetrics count cache hits and misses and time the reviews, by
// cluster.
type TokenCacheMetrics struct {
	hits, misses *prometheus.CounterVec
	latency      *prometheus.HistogramVec
}

// NewTokenCacheMetrics registers the cache's collectors.
func NewTokenCacheMetrics(reg prometheus.Registerer) *TokenCacheMetrics {
	m := &TokenCacheMetrics{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshca_tokenreview_cache_hits_total",
			Help: "Token authentications answered from the cache."}, []string{"cluster"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meshca_tokenreview_cache_misses_total",
			Help: "Token authentications that needed a TokenReview."}, []string{"cluster"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meshca_tokenreview_duration_seconds",
			Help: "TokenReview latency.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"cluster"}),
	}
	reg.MustRegister(m.hits, m.misses, m.latency)
	return m
}

func (m *TokenCacheMetrics) hit(cluster string) {
	if m != nil {
		m.hits.WithLabelValues(cluster).Inc()
	}
}

func (m *TokenCacheMetrics) miss(cluster string) {
	if m != nil {
		m.misses.WithLabelValues(cluster).Inc()
	}
}

func (m *TokenCacheMetrics) observe(cluster string, d time.Duration) {
	if m != nil {
		m.latency.WithLabelValues(cluster).Observe(d.Seconds())
	}
}
