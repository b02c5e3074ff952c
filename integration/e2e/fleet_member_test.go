package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// fleetIOTimeout bounds one CA request and one handshake.
const fleetIOTimeout = 5 * time.Second

// member is one simulated workload: its SVID and the bundle of its last
// reply, which is all it trusts, a TLS listener, and a CA client.
type member struct {
	id        spiffeid.ID
	td        spiffeid.TrustDomain
	tokenFile string
	caAddr    string
	lis       net.Listener
	crl       *crlFile // nil: no CRL is checked
	state     atomic.Pointer[memberState]

	mu     sync.Mutex // guards client
	client *caclient.Client
}

// memberState is what one reply gave a member.
type memberState struct {
	caSVID *caclient.SVID
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
}

func (m *member) current() *memberState { return m.state.Load() }

// GetX509SVID implements x509svid.Source: the member's current SVID.
func (m *member) GetX509SVID() (*x509svid.SVID, error) { return m.current().svid, nil }

// GetX509BundleForTrustDomain implements x509bundle.Source: only the
// bundle of the member's last reply.
func (m *member) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return m.current().bundle.GetX509BundleForTrustDomain(td)
}

// renew fetches a new SVID, retrying twice on a new connection that
// trusts the bundle of the last reply (the CA's serving certificate
// follows the active root), and counts every request.
func (m *member) renew(ctx context.Context, f *fleet) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			m.closeClient()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(200 * time.Millisecond):
			}
		}
		var svid *caclient.SVID
		if svid, err = m.fetch(ctx, f); err == nil {
			m.store(svid, f)
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		f.requestErrors.Add(1)
		f.record(fmt.Sprintf("CSR of %s: %v", m.id, err))
	}
	return err
}

func (m *member) fetch(ctx context.Context, f *fleet) (*caclient.SVID, error) {
	m.mu.Lock()
	if m.client == nil {
		roots := certs.Pool(f.oldRoot)
		if st := m.current(); st != nil {
			roots = certs.Pool(st.caSVID.Roots...)
		}
		c, err := caclient.New(caclient.Config{Addr: m.caAddr, ServerName: "istiod.istio-system.svc", Roots: roots,
			ClusterID: "Kubernetes", TokenFile: m.tokenFile})
		if err != nil {
			m.mu.Unlock()
			return nil, err
		}
		m.client = c
	}
	c := m.client
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, fleetIOTimeout)
	defer cancel()
	f.requests.Add(1)
	return c.Fetch(ctx, m.id, caclient.Options{TTL: f.leafTTL})
}

func (m *member) store(svid *caclient.SVID, f *fleet) {
	// The root signed the leaf, or the top of the intermediates it came
	// with (--upstream: an intermediate under the root).
	if svid.Chain[len(svid.Chain)-1].CheckSignatureFrom(f.oldRoot) == nil {
		f.oldLeaves.Add(1)
	} else {
		f.newLeaves.Add(1)
	}
	m.state.Store(&memberState{
		caSVID: svid,
		svid:   &x509svid.SVID{ID: svid.ID, Certificates: svid.Chain, PrivateKey: svid.Key},
		bundle: x509bundle.FromX509Authorities(m.td, svid.Roots),
	})
}

func (m *member) closeClient() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		m.client.Close()
		m.client = nil
	}
}

// fleetRenewJitter is how much earlier than at half its leaf's life a
// member may renew. Certificates count whole seconds, so every half-life
// falls on a half second: without jitter the whole fleet would renew in
// the same tenth of a second, every second, which workloads whose leaves
// live a day never do (istio-agent jitters too). Never later: the guards
// count on a renewal by half the life.
const fleetRenewJitter = time.Second

// renewLoop renews first after delay, which spreads the fleet's
// renewals as workloads started at different times would be, then at
// half the current leaf's life, NotBefore to NotAfter, as istio-agent
// counts it, less up to fleetRenewJitter, until ctx ends.
func (m *member) renewLoop(ctx context.Context, f *fleet, delay time.Duration) {
	at := time.Now().Add(delay)
	for {
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if err := m.renew(ctx, f); err != nil {
			select { // counted; try again shortly
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		leaf := m.current().caSVID.Chain[0]
		at = leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore)/2 - rand.N(fleetRenewJitter))
	}
}

// listen serves mutual TLS on a loopback port until the listener is
// closed: each connection is a handshake, one byte written, and waiting
// for the client to hang up.
func (m *member) listen(wg *sync.WaitGroup) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	m.lis = lis
	cfg := m.withCRL(tlsconfig.MTLSServerConfig(m, m, tlsconfig.AuthorizeMemberOf(m.td)))
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(fleetIOTimeout))
				tc := tls.Server(conn, cfg)
				if tc.Handshake() != nil {
					return
				}
				if _, err := tc.Write([]byte{1}); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, tc)
			})
		}
	})
	return nil
}

// dial handshakes with the member listening at addr as m, and reads its
// one byte: in TLS 1.3 the server judges the client's certificate after
// the client's handshake is done, and says so in an alert read here.
func (m *member) dial(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: fleetIOTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Reset rather than linger in TIME_WAIT: the fleet makes many
	// connections a second.
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.SetDeadline(time.Now().Add(fleetIOTimeout))
	tc := tls.Client(conn, m.withCRL(tlsconfig.MTLSClientConfig(m, m, tlsconfig.AuthorizeMemberOf(m.td))))
	if err := tc.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	var b [1]byte
	if _, err := io.ReadFull(tc, b[:]); err != nil {
		return fmt.Errorf("after the handshake: %w", err)
	}
	return nil
}
