package limit

import (
	"container/list"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// buckets are token buckets by key (a caller's identity, a peer's
// address), at most max of them, so that keys an attacker can mint do not
// grow the heap. A bucket that has refilled to its burst and holds no
// reservation carries no information and is dropped when a new key comes
// (idle eviction); when max buckets are kept all the same, the least
// recently used goes.
// Evicting a bucket that is not full forgives its debt: max is sized so
// that only a flood of keys can do that.
type buckets struct {
	limit rate.Limit
	burst int
	max   int

	mu    sync.Mutex
	byKey map[string]*list.Element // of *bucket
	lru   *list.List               // most recently used first
}

type bucket struct {
	key string
	lim *rate.Limiter
	// held counts the tokens reserved for outcomes not known yet
	// (reserve); they are not spent, and not free either.
	held int
}

// idleSweep is how many idle buckets a new key looks at, from the least
// recently used end, so that the map shrinks back after a burst of keys.
const idleSweep = 2

// newBuckets returns buckets refilling perSecond up to burst, or nil
// when perSecond is not positive: no limit.
func newBuckets(perSecond float64, burst, max int) *buckets {
	if perSecond <= 0 {
		return nil
	}
	return &buckets{limit: rate.Limit(perSecond), burst: burst, max: max, byKey: map[string]*list.Element{}, lru: list.New()}
}

// get returns key's bucket, creating a full one if there is none.
func (b *buckets) get(key string, now time.Time) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.getLocked(key, now).lim
}

func (b *buckets) getLocked(key string, now time.Time) *bucket {
	if el, ok := b.byKey[key]; ok {
		b.lru.MoveToFront(el)
		return el.Value.(*bucket)
	}
	for range idleSweep {
		el := b.lru.Back()
		if el == nil || el.Value.(*bucket).held > 0 || el.Value.(*bucket).lim.TokensAt(now) < float64(b.burst) {
			break
		}
		b.removeLocked(el)
	}
	for b.lru.Len() >= b.max {
		b.removeLocked(b.lru.Back())
	}
	bk := &bucket{key: key, lim: rate.NewLimiter(b.limit, b.burst)}
	b.byKey[key] = b.lru.PushFront(bk)
	return bk
}

func (b *buckets) removeLocked(el *list.Element) {
	b.lru.Remove(el)
	delete(b.byKey, el.Value.(*bucket).key)
}

// len is the number of buckets kept.
func (b *buckets) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lru.Len()
}

// take spends one token of key's bucket. When there is none it spends
// nothing and returns how long until there is one.
func (b *buckets) take(key string, now time.Time) (time.Duration, bool) {
	lim := b.get(key, now)
	if lim.AllowN(now, 1) {
		return 0, true
	}
	return untilToken(lim, 0, now), false
}

// check returns how long until key's bucket holds a token that is not
// reserved, without spending one; 0 when it does now.
func (b *buckets) check(key string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk := b.getLocked(key, now)
	return untilToken(bk.lim, b.heldAgainst(bk, now), now)
}

// heldAgainst is how many of bk's held tokens count as spent: none while
// the bucket is full (its key has not failed lately, and may have many
// outcomes pending at once: the Pods behind one NAT address starting
// together), all of them once it has failed, so that its outcomes
// pending never outnumber the tokens it has left.
func (b *buckets) heldAgainst(bk *bucket, now time.Time) int {
	if bk.lim.TokensAt(now) >= float64(b.burst) {
		return 0
	}
	return bk.held
}

// reserve holds one token of key's bucket for an outcome not known yet,
// so that concurrent requests cannot all count on the same token once
// the key has failed (heldAgainst). When every token is spent or held it
// holds one all the same, as a turn: wait is how long until the bucket
// has refilled it, after the turns taken before, and its holder waits
// that long before it goes on. A turn that would come later than most
// holds nothing: ok is false and wait says when one would come. settle ends
// the hold: spend spends the token, the bucket going into debt if need
// be (later turns then wait longer); otherwise it is given back
// untouched.
func (b *buckets) reserve(key string, now time.Time, most time.Duration) (settle func(spend bool, now time.Time), wait time.Duration, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk := b.getLocked(key, now)
	if wait = untilToken(bk.lim, b.heldAgainst(bk, now), now); wait > 0 && wait > most {
		return nil, wait, false
	}
	bk.held++
	return func(spend bool, now time.Time) {
		// bk may have been evicted meanwhile (a flood of keys): its
		// count then matters to no one.
		b.mu.Lock()
		defer b.mu.Unlock()
		bk.held--
		if spend {
			bk.lim.ReserveN(now, 1)
		}
	}, wait, true
}

// spend spends one token of key's bucket, into debt if need be: a
// failure counted against key without having waited for a token.
func (b *buckets) spend(key string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.getLocked(key, now).lim.ReserveN(now, 1)
}

// untilToken is how long until lim holds one token besides the held ones,
// rounded up to a millisecond; 0 when it holds one now.
func untilToken(lim *rate.Limiter, held int, now time.Time) time.Duration {
	missing := float64(1+held) - lim.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	d := time.Duration(missing / float64(lim.Limit()) * float64(time.Second))
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}
