package trust

import "testing"

// TestNewestSeen: the newest sequence of a lineage follows the ConfigMaps
// as they are written, edited and deleted, raised in place and counted
// again when the newest one goes.
func TestNewestSeen(t *testing.T) {
	ann := func(lineage, seq string) map[string]string {
		return map[string]string{AnnotationLineage: lineage, AnnotationSequence: seq}
	}
	ours := BundleVersion{Lineage: "L", Sequence: 4}
	var n newestSeen
	steps := []struct {
		name   string
		do     func()
		newest uint64
		newer  bool
	}{
		{"nothing seen", func() {}, 0, false},
		{"older in a", func() { n.see("a", ann("L", "3")) }, 3, false},
		{"newer in b", func() { n.see("b", ann("L", "5")) }, 5, true},
		{"another lineage in c", func() { n.see("c", ann("M", "9")) }, 5, true},
		{"b's annotation removed", func() { n.see("b", map[string]string{AnnotationLineage: "L"}) }, 3, false},
		{"a raised", func() { n.see("a", ann("L", "6")) }, 6, true},
		{"a deleted", func() { n.forget("a") }, 0, false},
		{"ours unversioned", func() { n.see("a", ann("L", "8")) }, 8, true},
	}
	for _, st := range steps {
		st.do()
		if st.name == "ours unversioned" {
			if _, newer := n.newer(BundleVersion{Sequence: 1}); newer {
				t.Fatalf("%s: a bundle without a lineage is never behind", st.name)
			}
		}
		seq, newer := n.newer(ours)
		if seq != st.newest || newer != st.newer {
			t.Errorf("%s: newest %d, newer %v; want %d, %v", st.name, seq, newer, st.newest, st.newer)
		}
	}
}
