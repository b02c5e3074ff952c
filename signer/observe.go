package signer

import (
	"context"
	"time"
)

// Observer hears of every answer of a backend: its name, how long Sign
// took, and the error (nil when it signed). Metrics implement it; it must
// not block.
type Observer interface {
	ObserveSign(backend string, took time.Duration, err error)
}

// Observe returns s, a backend named backend, wrapped so that o hears of
// each of its answers. Wrapping once where the backend is used gives
// every backend the same measurements.
func Observe(s Signer, backend string, o Observer) Signer {
	return &observed{inner: s, backend: backend, o: o}
}

type observed struct {
	inner   Signer
	backend string
	o       Observer
}

// Sign implements Signer.
func (s *observed) Sign(ctx context.Context, req *Request) (*Response, error) {
	start := time.Now()
	resp, err := s.inner.Sign(ctx, req)
	s.o.ObserveSign(s.backend, time.Since(start), err)
	return resp, err
}
