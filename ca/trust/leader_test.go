package trust_test

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshca/meshca/ca/trust"
)

func TestRunLeaderElectedRefuses(t *testing.T) {
	client := fake.NewClientset()
	run := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name, ns, lease, id string
		run                 func(context.Context) error
	}{
		{"no namespace", "", "l", "me", run},
		{"no lease", "ns", "", "me", run},
		{"no identity", "ns", "l", "", run},
		{"no run", "ns", "l", "me", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := trust.RunLeaderElected(context.Background(), client, tc.ns, tc.lease, tc.id, tc.run, nil); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestRunLeaderElectedReturns(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name   string
		run    func(ctx context.Context, cancel func()) error
		want   error
		wantOK bool // want nil
	}{
		{name: "run fails", run: func(context.Context, func()) error { return boom }, want: boom},
		{name: "run finishes", run: func(context.Context, func()) error { return nil }, wantOK: true},
		{name: "ctx ends", run: func(ctx context.Context, cancel func()) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}, wantOK: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := trust.RunLeaderElected(ctx, client, "ns", "lease", "me",
				func(lctx context.Context) error { return tc.run(lctx, cancel) }, nil)
			switch {
			case tc.wantOK && err != nil:
				t.Fatalf("err = %v, want nil", err)
			case !tc.wantOK && !errors.Is(err, tc.want):
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			lease, err := client.CoordinationV1().Leases("ns").Get(context.Background(), "lease", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
				t.Errorf("lease still held by %q after return", *h)
			}
		})
	}
}
