package signer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/signer"
)

// stubSigner answers after delay with resp or err.
type stubSigner struct {
	delay time.Duration
	resp  *signer.Response
	err   error
}

func (s stubSigner) Sign(ctx context.Context, _ *signer.Request) (*signer.Response, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.resp, s.err
}

// observation is one ObserveSign call.
type observation struct {
	backend string
	took    time.Duration
	err     error
}

type recorder struct {
	mu  sync.Mutex
	got []observation
}

func (r *recorder) ObserveSign(backend string, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, observation{backend, took, err})
}

// TestObserve: the wrapper hands back exactly what the backend answered,
// and the observer hears of every answer once, with its backend, a
// duration at least the backend's and the backend's own error.
func TestObserve(t *testing.T) {
	refused := signer.Errorf("vault", signer.KindRefused, "role forbids the name")
	leaf := &signer.Response{}
	tests := []struct {
		name    string
		inner   stubSigner
		ctx     func() (context.Context, context.CancelFunc)
		wantErr error
	}{
		{name: "signed", inner: stubSigner{delay: 20 * time.Millisecond, resp: leaf}},
		{name: "refused", inner: stubSigner{delay: 20 * time.Millisecond, err: refused}, wantErr: refused},
		{name: "deadline", inner: stubSigner{delay: time.Minute},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Millisecond)
			},
			wantErr: context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			if tt.ctx != nil {
				ctx, cancel = tt.ctx()
			}
			defer cancel()
			rec := &recorder{}
			s := signer.Observe(tt.inner, "vault", rec)
			resp, err := s.Sign(ctx, &signer.Request{})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (resp == leaf) {
				t.Fatalf("Sign = %v, %v; want the backend's own answer (%v)", resp, err, tt.wantErr)
			}
			if len(rec.got) != 1 {
				t.Fatalf("%d observations, want 1", len(rec.got))
			}
			o := rec.got[0]
			if o.backend != "vault" || !errors.Is(o.err, tt.wantErr) || (tt.wantErr == nil) != (o.err == nil) {
				t.Errorf("observed %+v, want backend vault and error %v", o, tt.wantErr)
			}
			if o.took < 20*time.Millisecond {
				t.Errorf("observed %v, want at least the backend's 20ms", o.took)
			}
		})
	}
}
