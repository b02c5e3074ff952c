package keymgr_test

import (
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
)

// TestLineage: a state keeps its lineage through its steps and through
// its encoding (every replica computes the same one), and a state built
// anew on the same authority at another time is another lineage.
func TestLineage(t *testing.T) {
	h := func(d time.Duration) time.Time { return lcT0.Add(d) }
	a := lcGenerated(t)
	s := &keymgr.State{}
	if err := s.Bootstrap(a, h(0), "first"); err != nil {
		t.Fatal(err)
	}
	lineage := s.View().Lineage()
	if len(lineage) != 32 {
		t.Fatalf("lineage %q, want 32 hex digits", lineage)
	}
	b := lcGenerated(t)
	if err := s.Prepare(b, h(time.Hour), "next"); err != nil {
		t.Fatal(err)
	}
	if got := s.View().Lineage(); got != lineage {
		t.Errorf("a prepared authority changed the lineage: %s, was %s", got, lineage)
	}
	entries, err := keymgr.EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := keymgr.DecodeState(entries)
	if err != nil {
		t.Fatal(err)
	}
	if got := decoded.View().Lineage(); got != lineage {
		t.Errorf("decoded lineage %s, want %s", got, lineage)
	}
	again := &keymgr.State{}
	same := &keymgr.AuthorityRecord{Root: a.Root, Cert: a.Cert, Key: a.Key, Generated: true}
	if err := again.Bootstrap(same, h(48*time.Hour), "store deleted"); err != nil {
		t.Fatal(err)
	}
	if again.View().Lineage() == lineage {
		t.Error("a state built anew on the same authority has the old lineage")
	}
	if (&keymgr.State{}).View().Lineage() != "" {
		t.Error("an empty state has a lineage")
	}
}
