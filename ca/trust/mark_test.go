package trust_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca/trust"
)

// TestMarkEnsure: the record's answers, its compare-and-swap against the
// elector's renewals, and what it costs once a version is recorded.
func TestMarkEnsure(t *testing.T) {
	v := trust.BundleVersion{Lineage: "L", Sequence: 6}
	tests := []struct {
		name      string
		recorded  map[string]string
		noLease   bool
		conflicts int64
		want      string // error fragment; "" for none
		stale     bool
		after     map[string]string
	}{
		{name: "records a newer version", recorded: versioned("L", "5"), after: versioned("L", "6")},
		{name: "after a conflict with a renewal", recorded: versioned("L", "5"), conflicts: 2, after: versioned("L", "6")},
		{name: "conflicts without end", recorded: versioned("L", "5"), conflicts: 100, want: "5 conflicts in a row", after: versioned("L", "5")},
		{name: "a newer one recorded", recorded: versioned("L", "7"), want: "sequence 7) is newer than this replica's CA state (sequence 6)",
			stale: true, after: versioned("L", "7")},
		{name: "another lineage recorded", recorded: versioned("M", "1"), want: "belongs to another CA state (lineage M; this replica's is L)",
			stale: true, after: versioned("M", "1")},
		{name: "another lineage recorded, its sequence removed", recorded: map[string]string{trust.AnnotationLineage: "M"},
			want: "belongs to another CA state", stale: true, after: map[string]string{trust.AnnotationLineage: "M"}},
		{name: "this lineage recorded, its sequence removed", recorded: map[string]string{trust.AnnotationLineage: "L"},
			after: map[string]string{trust.AnnotationLineage: "L", trust.AnnotationSequence: "6"}},
		{name: "no Lease", noLease: true, want: "read the published version from Lease meshca/meshca-trust-publisher"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			if !tt.noLease {
				client = fake.NewClientset(leaseWith(tt.recorded))
			}
			var updates, conflicts atomic.Int64
			client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				updates.Add(1)
				if conflicts.Add(1) <= tt.conflicts {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, leaseName, errors.New("renewed"))
				}
				return false, nil, nil
			})
			m := markOf(client)
			err := m.Ensure(context.Background(), v)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Ensure: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Ensure: %v, want %q", err, tt.want)
			case errors.Is(err, trust.ErrStale) != tt.stale:
				t.Fatalf("Ensure: %v; a refusal of the record: %v, want %v", err, errors.Is(err, trust.ErrStale), tt.stale)
			}
			if tt.noLease {
				return
			}
			if got := leaseAnnotations(t, client); !equalMaps(got, tt.after) {
				t.Errorf("the Lease's annotations %v, want %v", got, tt.after)
			}
			if err == nil {
				n := updates.Load()
				if err := m.Ensure(context.Background(), v); err != nil || updates.Load() != n {
					t.Errorf("ensuring the recorded version again: %v, %d more updates; want nothing asked", err, updates.Load()-n)
				}
			}
		})
	}
	t.Run("a refusal is remembered until Recheck", func(t *testing.T) {
		client := fake.NewClientset(leaseWith(versioned("L", "7")))
		var gets atomic.Int64
		client.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			gets.Add(1)
			return false, nil, nil
		})
		m := markOf(client)
		for range 3 {
			if err := m.Ensure(context.Background(), v); !errors.Is(err, trust.ErrStale) {
				t.Fatalf("Ensure: %v, want a refusal", err)
			}
		}
		if n := gets.Load(); n != 1 {
			t.Fatalf("%d reads of the Lease for 3 Ensures of a refused version, want 1", n)
		}
		if err := m.Recheck(context.Background(), v); !errors.Is(err, trust.ErrStale) || gets.Load() != 2 {
			t.Fatalf("Recheck: %v after %d reads; want a refusal read again", err, gets.Load())
		}
	})
	t.Run("a zero version is neither checked nor recorded", func(t *testing.T) {
		client := fake.NewClientset(leaseWith(versioned("M", "1")))
		if err := markOf(client).Ensure(context.Background(), trust.BundleVersion{}); err != nil {
			t.Fatal(err)
		}
		var none *trust.Mark
		if err := none.Ensure(context.Background(), v); err != nil {
			t.Fatalf("a nil Mark: %v", err)
		}
	})
}
