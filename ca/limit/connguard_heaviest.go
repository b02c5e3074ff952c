package limit

// heaviest keeps a weight for each key and finds a key of the largest in
// constant time: the guard asks it which address holds the most when it
// must make room. Weights change by small steps, so a key moves between
// neighbouring buckets.
type heaviest[K comparable] struct {
	weight  map[K]int
	buckets map[int]map[K]struct{}
	max     int // the largest weight held; 0 when none
}

func newHeaviest[K comparable]() *heaviest[K] {
	return &heaviest[K]{weight: map[K]int{}, buckets: map[int]map[K]struct{}{}}
}

// set gives k weight w; a weight of 0 or less forgets k.
func (h *heaviest[K]) set(k K, w int) {
	old, ok := h.weight[k]
	if ok && old == w {
		return
	}
	if ok {
		b := h.buckets[old]
		delete(b, k)
		if len(b) == 0 {
			delete(h.buckets, old)
		}
		delete(h.weight, k)
	}
	if w > 0 {
		h.weight[k] = w
		b := h.buckets[w]
		if b == nil {
			b = map[K]struct{}{}
			h.buckets[w] = b
		}
		b[k] = struct{}{}
		h.max = max(h.max, w)
	}
	for h.max > 0 && len(h.buckets[h.max]) == 0 {
		h.max--
	}
}

// top returns a key of the largest weight, and that weight; false when
// no key has any.
func (h *heaviest[K]) top() (k K, w int, ok bool) {
	for k := range h.buckets[h.max] {
		return k, h.max, true
	}
	return k, 0, false
}
