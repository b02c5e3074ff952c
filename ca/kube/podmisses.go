package kube

import (
	"container/list"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

const (
	// missTTL is how long the apiserver's answer that a question of the
	// index has no live Pod is given again without another list.
	missTTL = 5 * time.Second
	// maxMisses bounds the answers remembered; the oldest go first.
	maxMisses = 4096
)

// podMisses remembers, for missTTL, the index misses the apiserver
// confirmed (no live Pod of an account, or of an account on a node), and
// lets concurrent misses of one question share one list.
//
// Nothing invalidates an entry when the informer adds a matching Pod: the
// index is asked before podMisses, so a Pod it holds is never hidden by a
// remembered miss. An entry only answers while the index has no such Pod
// either, for at most missTTL.
type podMisses struct {
	now    func() time.Time
	flight singleflight.Group

	mu    sync.Mutex
	byKey map[string]*list.Element // of *podMiss
	fifo  *list.List               // oldest first, which, with one TTL, is soonest to expire first
}

type podMiss struct {
	key     string
	expires time.Time
}

func newPodMisses() *podMisses {
	return &podMisses{now: time.Now, byKey: map[string]*list.Element{}, fifo: list.New()}
}

// missKey is the key of one question: its kind ("of", "on") and its names,
// which cannot hold a NUL.
func missKey(parts ...string) string { return strings.Join(parts, "\x00") }

// known reports whether key's miss was confirmed less than missTTL ago.
func (m *podMisses) known(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.byKey[key]
	if !ok {
		return false
	}
	if m.now().Before(el.Value.(*podMiss).expires) {
		return true
	}
	m.removeLocked(el)
	return false
}

// put remembers key's miss for missTTL, forgetting expired misses and
// the oldest past maxMisses.
func (m *podMisses) put(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if el, ok := m.byKey[key]; ok {
		m.removeLocked(el)
	}
	m.byKey[key] = m.fifo.PushBack(&podMiss{key: key, expires: now.Add(missTTL)})
	for el := m.fifo.Front(); el != nil && (m.fifo.Len() > maxMisses || !now.Before(el.Value.(*podMiss).expires)); el = m.fifo.Front() {
		m.removeLocked(el)
	}
}

func (m *podMisses) removeLocked(el *list.Element) {
	m.fifo.Remove(el)
	delete(m.byKey, el.Value.(*podMiss).key)
}
