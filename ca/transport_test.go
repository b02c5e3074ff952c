package ca_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/internal/testca"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// hugeHeaderRequest speaks HTTP/2 to addr as an attacker would: it
// ignores the server's SETTINGS_MAX_HEADER_LIST_SIZE and sends one
// CreateCertificate whose bearer token is tokenBytes long, then reads
// until the server answers, resets the stream or closes. It returns how
// the server ended the request: "rst <code>", "status <grpc-status>",
// "goaway" or "closed".
func hugeHeaderRequest(t *testing.T, addr string, tc *tls.Config, tokenBytes int) string {
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Errorf("dial: %v", err)
		return "dial failed"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "https"},
		{Name: ":path", Value: "/istio.v1.auth.IstioCertificateService/CreateCertificate"},
		{Name: ":authority", Value: "istiod.istio-system.svc"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "te", Value: "trailers"},
		{Name: "authorization", Value: "Bearer " + strings.Repeat("a", tokenBytes)},
	} {
		_ = enc.WriteField(f)
	}
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return "closed"
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_ = fr.WriteSettings()
	const chunk = 16 << 10
	b := block.Bytes()
	first := b[:min(chunk, len(b))]
	b = b[len(first):]
	if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first, EndHeaders: len(b) == 0}) != nil {
		return "closed"
	}
	for len(b) > 0 {
		n := min(chunk, len(b))
		if fr.WriteContinuation(1, n == len(b), b[:n]) != nil {
			return "closed"
		}
		b = b[n:]
	}
	// An empty IstioCertificateRequest: uncompressed, zero length.
	_ = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "closed"
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			return "rst " + f.ErrCode.String()
		case *http2.GoAwayFrame:
			return "goaway"
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "" && s != "200" {
				return "http " + s
			}
			for _, h := range f.RegularFields() {
				if h.Name == "grpc-status" {
					return "status " + h.Value
				}
			}
		}
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestHugeHeadersKeepHeapBounded: 100 concurrent requests with a 1 MiB
// token each, from a client that ignores the advertised header limit, hold
// almost nothing in the server's heap and never reach an authenticator.
// Without the limit each token would be held whole while it is
// authenticated (100 MiB here).
func TestHugeHeadersKeepHeapBounded(t *testing.T) {
	const (
		clients    = 100
		tokenBytes = 1 << 20
		bound      = 32 << 20
	)
	root := testca.NewRoot(t, "root", testca.Options{})
	g := newGate("")
	f := newFixture(t, root.Authority(), options{authn: anyToken{g}})
	defer close(g.release)
	tc := &tls.Config{RootCAs: f.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}}
	before := heapInUse()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[string]int{}
	)
	for range clients {
		wg.Go(func() {
			o := hugeHeaderRequest(t, f.addr, tc, tokenBytes)
			mu.Lock()
			outcomes[o]++
			mu.Unlock()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// Measure once every request was answered, or once they have all
	// reached authentication and are held there.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for g.calls.Load() < clients {
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("requests neither answered nor authenticated in time")
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	grown := int64(heapInUse()) - int64(before)
	<-done
	// The transport refuses the header list itself (a 1 MiB value closes
	// the connection; a list just over the limit resets the stream)
	// before any handler runs: no request gets a gRPC status.
	for o := range outcomes {
		if strings.HasPrefix(o, "status") || strings.HasPrefix(o, "http") {
			t.Errorf("outcomes %v: a handler answered; want every request refused by the transport", outcomes)
		}
	}
	if n := g.calls.Load(); n != 0 {
		t.Errorf("%d oversized tokens reached an authenticator", n)
	}
	if grown > bound {
		t.Fatalf("heap grew by %d MiB with %d requests in flight, want under %d MiB", grown>>20, clients, bound>>20)
	}
	t.Logf("heap grew by %.1f MiB for %d requests with %d KiB tokens", float64(grown)/(1<<20), clients, tokenBytes>>10)
}

// anyToken hands every request with a token to its gate.
type anyToken struct{ g *gate }

func (a anyToken) Authenticate(ctx context.Context, c *ca.Credentials) (*ca.Caller, error) {
	if c.Token == "" {
		return nil, ca.ErrNoCredentials
	}
	a.g.calls.Add(1)
	select {
	case <-a.g.release:
	case <-ctx.Done():
	}
	return nil, ca.ErrNoCredentials
}
