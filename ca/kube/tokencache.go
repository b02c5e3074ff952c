package kube

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
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
// replaced, and a review that was in flight when its Pod went is dropped.
type CachedTokenReviewer struct {
	c       TokenCacheConfig
	flight  singleflight.Group
	mu      sync.Mutex
	entries map[string]*list.Element
	lru     *list.List
	byPod   map[string]map[string]struct{}
	refused map[string]refusal
	fifo    *list.List // keys of refused, oldest first
	// epoch counts Pod invalidations; gone records, by Pod UID, the epoch
	// and time of its last invalidation, for reviews still in flight.
	epoch uint64
	gone  map[string]invalidation
}

type refusal struct {
	err     error
	expires time.Time
}

type invalidation struct {
	epoch uint64
	at    time.Time
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
		refused: map[string]refusal{}, fifo: list.New(), gone: map[string]invalidation{}}
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
		epoch := r.currentEpoch()
		// The review serves every waiter, so it must not die with the
		// first caller's context; it gets its own bound instead.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		id, err := r.c.Reviewer.Review(rctx, token)
		r.c.Metrics.observe(r.c.Cluster, r.c.Now().Sub(start))
		switch {
		case err == nil:
			r.put(key, id, tokenExpiry(token), epoch)
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

func (r *CachedTokenReviewer) currentEpoch() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.epoch
}

// put caches a positive review that started at epoch, unless the Pod its
// token is bound to was invalidated since.
func (r *CachedTokenReviewer) put(key string, c *Identity, tokenExp time.Time, epoch uint64) {
	expires := r.c.Now().Add(r.c.TTL)
	if !tokenExp.IsZero() && tokenExp.Before(expires) {
		expires = tokenExp
	}
	if !r.c.Now().Before(expires) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.gone[c.PodUID]; ok && c.PodUID != "" && g.epoch > epoch {
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
// and the result of any review of such a token still in flight.
func (r *CachedTokenReviewer) InvalidatePod(uid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.c.Now()
	r.epoch++
	r.gone[uid] = invalidation{epoch: r.epoch, at: now}
	for u, g := range r.gone {
		// No review outlives reviewTimeout; older records protect nothing.
		if now.Sub(g.at) > 2*reviewTimeout {
			delete(r.gone, u)
		}
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
