package limit

import (
	"container/list"
	"context"
	"crypto/sha256"
	"sync"
)

// Vouch tells, before any review, a token likely to pass from one that is
// not: the cluster's side of the review turns (ca/kube.Plausibility).
type Vouch interface {
	// Plausible reports whether token, read without verifying it, is a
	// credential the cluster would accept: a bound service-account token
	// for the CA's audience, not expired, naming a Pod the cluster holds
	// live with the UID and service account it claims. It asks no one.
	// subject names what the token claims to be (its Pod), the same for
	// every token of that Pod and no other; "" when it is not plausible.
	Plausible(ctx context.Context, token string) (subject string, ok bool)
}

// lane is the queue of review turns a token takes at its address.
type lane byte

const (
	// suspectLane: a token Vouch does not vouch for, or one that, or
	// whose subject, failed review from its address before. Its turns
	// come as the address's failures refill (Limits.PeerFailureRate).
	suspectLane lane = 's'
	// plausibleLane: a token Vouch vouches for that has not failed from
	// its address, nor has its subject. Its turns come from a bucket of
	// its own, of the same size, that only the failures of plausible
	// tokens spend: a flood of suspect tokens never delays it.
	plausibleLane lane = 'p'
)

func (ln lane) String() string {
	if ln == plausibleLane {
		return "plausible"
	}
	return "suspect"
}

// standing is where a token stands at its address: its lane and the
// subject Vouch read from it.
type standing struct {
	lane    lane
	subject string
}

// classify puts token, from peer, in its lane. Without a Vouch, or with
// the failure budget off, every token is suspect.
func (l *limiter) classify(ctx context.Context, v Vouch, peer string, sum [sha256.Size]byte, token string) standing {
	if v == nil || l.marks == nil {
		return standing{lane: suspectLane}
	}
	subject, ok := v.Plausible(ctx, token)
	if !ok {
		return standing{lane: suspectLane}
	}
	if l.marks.has(markOf(peer, markToken, sum[:])) || l.marks.has(markOf(peer, markSubject, []byte(subject))) {
		return standing{lane: suspectLane, subject: subject}
	}
	return standing{lane: plausibleLane, subject: subject}
}

// reviewed records how the review of a token, from peer, ended: a failure
// marks the token and its subject as failed there (so that the next
// token claiming that subject waits in the suspect lane); a success
// clears them (a Pod whose subject a neighbour spoiled, once served,
// gets its next token reviewed at once again).
func (l *limiter) reviewed(peer string, sum [sha256.Size]byte, st standing, failed bool) {
	if l.marks == nil {
		return
	}
	keys := []markKey{markOf(peer, markToken, sum[:])}
	if st.subject != "" {
		keys = append(keys, markOf(peer, markSubject, []byte(st.subject)))
	}
	for _, k := range keys {
		if failed {
			l.marks.add(k)
		} else {
			l.marks.remove(k)
		}
	}
}

// markKey is a failed token or subject at an address, hashed: a mark
// costs the same whatever the token's length.
type markKey [sha256.Size]byte

const (
	markToken   = 't'
	markSubject = 's'
)

func markOf(peer string, kind byte, v []byte) markKey {
	h := sha256.New()
	h.Write([]byte(peer))
	h.Write([]byte{0, kind})
	h.Write(v)
	var k markKey
	h.Sum(k[:0])
	return k
}

// failedMarks remember the tokens and subjects that failed review from
// each address, at most max of them over all addresses (~150 bytes each),
// the least recently failed going first. Forgetting a mark lets its token
// or subject into the plausible lane again, whose own bucket still bounds
// what its failures cost: max is sized so that only a flood of failures
// from many addresses can do that.
type failedMarks struct {
	max int

	mu    sync.Mutex
	byKey map[markKey]*list.Element // of markKey
	lru   *list.List                // most recently failed first
}

func newFailedMarks(max int) *failedMarks {
	return &failedMarks{max: max, byKey: map[markKey]*list.Element{}, lru: list.New()}
}

func (m *failedMarks) has(k markKey) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.byKey[k]
	return ok
}

func (m *failedMarks) add(k markKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[k]; ok {
		m.lru.MoveToFront(el)
		return
	}
	for m.lru.Len() >= m.max {
		el := m.lru.Back()
		m.lru.Remove(el)
		delete(m.byKey, el.Value.(markKey))
	}
	m.byKey[k] = m.lru.PushFront(k)
}

func (m *failedMarks) remove(k markKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.byKey[k]; ok {
		m.lru.Remove(el)
		delete(m.byKey, k)
	}
}

// len is the number of marks kept.
func (m *failedMarks) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lru.Len()
}
