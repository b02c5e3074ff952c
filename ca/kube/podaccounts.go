package kube

import (
	"slices"
	"sync"
	"unique"
)

// accountIndex finds the Pods of a service account on a node (what a node
// proxy may ask for) and on any node (a renewal by client certificate).
// It is fed by the Pod informer's event handler, a moment after the
// informer's own store. client-go's indexers kept a set (a map of its
// own, ~200 bytes) per distinct value of each index, which most Pods have
// alone; these two maps cost a slot and a pointer per Pod.
type accountIndex struct {
	mu     sync.RWMutex
	onNode map[nodeAccount][]*podRecord
	of     map[account][]*podRecord
}

type account struct{ ns, sa unique.Handle[string] }

type nodeAccount struct {
	account
	node unique.Handle[string]
}

func newAccountIndex() *accountIndex {
	return &accountIndex{onNode: map[nodeAccount][]*podRecord{}, of: map[account][]*podRecord{}}
}

func (p *podRecord) account() account { return account{ns: p.namespace, sa: p.serviceAccount} }

func (x *accountIndex) add(p *podRecord) {
	x.mu.Lock()
	defer x.mu.Unlock()
	a := p.account()
	x.of[a] = append(x.of[a], p)
	if p.node.Value() != "" {
		k := nodeAccount{a, p.node}
		x.onNode[k] = append(x.onNode[k], p)
	}
}

// remove drops the record of p's Pod (by namespace and name) from where p
// was indexed.
func (x *accountIndex) remove(p *podRecord) {
	x.mu.Lock()
	defer x.mu.Unlock()
	a := p.account()
	removeFrom(x.of, a, p)
	removeFrom(x.onNode, nodeAccount{a, p.node}, p)
}

func removeFrom[K comparable](m map[K][]*podRecord, k K, p *podRecord) {
	list := m[k]
	i := slices.IndexFunc(list, func(q *podRecord) bool { return q == p || q.name == p.name && q.namespace == p.namespace })
	switch {
	case i < 0:
		return
	case len(list) == 1:
		delete(m, k)
		return
	}
	list[i] = list[len(list)-1]
	list[len(list)-1] = nil
	m[k] = list[:len(list)-1]
}

// liveOnNode returns the not-terminated Pods of ns/sa on node.
func (x *accountIndex) liveOnNode(ns, sa, node string) []PodInfo {
	k := nodeAccount{account{unique.Make(ns), unique.Make(sa)}, unique.Make(node)}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return liveRecords(x.onNode[k])
}

// liveOf returns the not-terminated Pods of ns/sa on any node.
func (x *accountIndex) liveOf(ns, sa string) []PodInfo {
	k := account{unique.Make(ns), unique.Make(sa)}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return liveRecords(x.of[k])
}

// liveRecords keeps the Pods that have not terminated (those being
// deleted too: they run while they drain).
func liveRecords(list []*podRecord) []PodInfo {
	var out []PodInfo
	for _, p := range list {
		if !p.terminated {
			out = append(out, *p.info())
		}
	}
	return out
}
