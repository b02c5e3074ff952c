package e2e

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestHalfOpenStreamFloodOneAddress (issue 28, item 1): one address
// without any token opens as many connections as `meshca serve` lets it
// with its defaults, and on each as many CreateCertificate streams as a
// connection may have (256), each its headers alone: no message, so no
// handler ever runs and, before the fix, no deadline either. meshca
// holds at most --max-unauthenticated-streams-per-peer of them, refuses
// the rest before they cost a goroutine, closes the connections that
// keep being refused, and cancels those it holds at
// --request-message-timeout; a client from another address is served
// meanwhile, and meshca's RSS stays far under the chart's memory limit.
// Before, every stream was held (~12 KiB each, 64,000 from one
// address), for as long as the connection lived.
func TestHalfOpenStreamFloodOneAddress(t *testing.T) {
	const conns, perConn, from = 250, 256, "127.0.5.1"
	raiseNoFile(t, conns+1024)
	// The chart passes its memory limit (--memory-limit, from the
	// downward API), which sets the Go runtime's soft limit: so does the
	// test.
	s := startServer(t, fmt.Sprintf("--memory-limit=%d", chartMemoryLimit))
	w := cluster.NewWorkload(t, cluster.Namespace(t, "streamflood"), "other", "node-a")
	rssBefore := procStatus(t, s.Pid(), "VmRSS")
	tc := &tls.Config{RootCAs: s.roots, ServerName: "istiod.istio-system.svc", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}

	var (
		sent, failed atomic.Int64
		mu           sync.Mutex
		held         []net.Conn
		wg           sync.WaitGroup
		next         atomic.Int64
		start        = time.Now()
	)
	defer func() { closeAll(held) }()
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= conns {
				d := &tls.Dialer{NetDialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}, Config: tc}
				c, err := d.Dial("tcp", s.Addr)
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
				n, err := halfOpenStreams(c, perConn)
				sent.Add(int64(n))
				if err != nil {
					failed.Add(1)
				}
				go drain(c)
			}
		})
	}
	wg.Wait()
	floodTook := time.Since(start)
	time.Sleep(2 * time.Second) // within the 5 s --request-message-timeout
	during, duringHWM := procStatus(t, s.Pid(), "VmRSS"), procStatus(t, s.Pid(), "VmHWM")
	e := scrapeMetricsTB(t, s.AdminAddr)
	unauth := sampleValue(e, "meshca_streams_unauthenticated", "", "")
	refused := sampleValue(e, "meshca_streams_refused_total", "reason", "per_peer")
	closed := sampleValue(e, "meshca_connections_refused_total", "reason", "streams_refused")
	issueStart := time.Now()
	_, issueErr := issueFrom(t, s, w, "127.0.5.2")
	issueTook := time.Since(issueStart)
	time.Sleep(6 * time.Second) // past the deadline of every stream held
	after := procStatus(t, s.Pid(), "VmRSS")
	timedOut := sampleValue(scrapeMetricsTB(t, s.AdminAddr), "meshca_streams_refused_total", "reason", "message_timeout")

	harness.Report(t, "half-open stream flood from %s: %d streams sent over %d connections in %v (%d connections cut or refused); "+
		"meshca_streams_unauthenticated %.0f, refused per_peer %.0f, connections closed for refused streams %.0f, cancelled at the message deadline %.0f; "+
		"a certificate for 127.0.5.2 in %v (%v); meshca VmRSS %d MiB before, %d MiB during (peak %d MiB), %d MiB 8 s later; chart limit %d MiB",
		from, sent.Load(), conns, floodTook.Round(time.Millisecond), failed.Load(), unauth, refused, closed, timedOut,
		issueTook.Round(time.Millisecond), issueErr, rssBefore>>20, during>>20, duringHWM>>20, after>>20, chartMemoryLimit>>20)
	if issueErr != nil {
		t.Errorf("a client from 127.0.5.2 during the flood: %v", issueErr)
	}
	if unauth > defaultMaxUnauthStreamsPerPeer {
		t.Errorf("meshca_streams_unauthenticated %.0f during the flood, over --max-unauthenticated-streams-per-peer's %d", unauth, defaultMaxUnauthStreamsPerPeer)
	}
	if duringHWM > chartMemoryLimit*3/4 {
		t.Errorf("meshca's peak VmRSS %d MiB under the flood, over 3/4 of the chart's memory limit (%d MiB)", duringHWM>>20, chartMemoryLimit>>20)
	}
}

// defaultMaxUnauthStreamsPerPeer is
// limit.DefaultMaxUnauthenticatedStreamsPerPeer.
const defaultMaxUnauthStreamsPerPeer = 256

// halfOpenStreams sends the HTTP/2 preface and n CreateCertificate
// streams' headers on c, and no message; it returns how many it sent.
func halfOpenStreams(c net.Conn, n int) (int, error) {
	if err := h2Preface(c); err != nil {
		return 0, err
	}
	fr := http2.NewFramer(c, nil)
	var block []byte
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":authority", "istiod.istio-system.svc"},
		{":path", methodCreateCertificate}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		block = hpackLiteral(block, kv[0], kv[1])
	}
	for i := range n {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true}); err != nil {
			return i, err
		}
	}
	return n, nil
}

// drain reads and drops what the server sends on c, acknowledging
// nothing, until c is closed.
func drain(c net.Conn) {
	fr := http2.NewFramer(nil, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		if _, err := fr.ReadFrame(); err != nil {
			return
		}
	}
}
