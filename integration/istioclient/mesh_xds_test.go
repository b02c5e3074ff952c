package istioclient

// The xDS side of the mesh: clients made with Istio's own ADS client
// (pkg/adsc), as proxies of the workload. Each presents the agent's current
// certificate (its OUTPUT_CERTS) and verifies istiod with the bundle the
// workload's namespace was published when it opened; one more reaches
// istiod through the agent's xDS proxy, as Envoy does. They stay open from
// the phase that opened them on: the held streams.

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v3 "istio.io/istio/pilot/pkg/xds/v3"
	"istio.io/istio/pkg/adsc"

	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/keymgr/certs"
)

// xdsClient is one adsc client. adsc reconnects on its own when its
// stream ends; a gRPC stats handler sees the ends and the transports
// (each one a completed TLS handshake), its response handler the CDS
// responses.
type xdsClient struct {
	name  string
	roots []*x509.Certificate // what it verifies istiod with; nil through the agent, which verifies istiod itself
	c     *adsc.ADSC

	mu     sync.Mutex
	cds    int       // CDS responses
	last   time.Time // of the last one
	ends   []time.Time
	conns  int // transports established
	closed bool
}

func (x *xdsClient) HandleResponse(_ *adsc.ADSC, r *discovery.DiscoveryResponse) {
	if r.TypeUrl != v3.ClusterType {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.cds++
	x.last = time.Now()
}

func (x *xdsClient) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (x *xdsClient) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (x *xdsClient) HandleRPC(_ context.Context, s stats.RPCStats) {
	if e, ok := s.(*stats.End); ok && e.IsClient() {
		x.mu.Lock()
		defer x.mu.Unlock()
		if !x.closed {
			x.ends = append(x.ends, e.EndTime)
		}
	}
}

func (x *xdsClient) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		x.mu.Lock()
		defer x.mu.Unlock()
		x.conns++
	}
}

// state is what the client saw so far.
func (x *xdsClient) state() (cds int, last time.Time, ends []time.Time, conns int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cds, x.last, append([]time.Time(nil), x.ends...), x.conns
}

// connected reports whether the client got a response after its last
// stream ended, i.e. whether it is served now.
func (x *xdsClient) connected() bool {
	_, last, ends, _ := x.state()
	return len(ends) == 0 || last.After(ends[len(ends)-1])
}

func (x *xdsClient) close() {
	x.mu.Lock()
	x.closed = true
	x.mu.Unlock()
	x.c.Close()
}

// dial opens the client's stream to addr, asks for CDS and waits for it.
func (x *xdsClient) dial(addr string, cfg adsc.Config) error {
	cfg.IP = "127.0.0.1"
	cfg.GrpcOpts = append(cfg.GrpcOpts, grpc.WithStatsHandler(x))
	c, err := adsc.New(addr, &adsc.ADSConfig{Config: cfg, ResponseHandler: x,
		InitialDiscoveryRequests: []*discovery.DiscoveryRequest{{TypeUrl: v3.ClusterType}}})
	if err != nil {
		return err
	}
	x.c = c
	if err := c.Run(); err != nil {
		c.Close()
		return err
	}
	if _, err := c.WaitVersion(20*time.Second, v3.ClusterType, ""); err != nil {
		x.close()
		return err
	}
	return nil
}

// xdsFleet is every client the test opened.
type xdsFleet struct {
	t         *testing.T
	addr      string // istiod's Service
	san       string // the name istiod's certificate must carry
	certDir   string // the agent's OUTPUT_CERTS
	rootFile  string // istio-ca-root-cert as mounted in the workload
	namespace string
	workload  string
	socket    string // the agent's xDS proxy
	snapshots string // a directory for the bundles clients verify istiod with

	clients []*xdsClient
	opened  []string // the phase of each client, in order
	dropped int      // clients closed as their bundle lost istiod's root
	pushes  int
}

// open opens a client presenting the agent's certificate, verifying
// istiod with the bundle published to the workload's namespace now (adsc
// reads XDSRootCAFile once; the snapshot makes that explicit), and fails
// the test when istiod does not serve it.
func (f *xdsFleet) open(phase string) {
	f.t.Helper()
	n := len(f.clients) + 1
	bundle, err := os.ReadFile(f.rootFile)
	if err != nil {
		f.t.Fatal(err)
	}
	roots, err := pemutil.ParseCertificates(bundle)
	if err != nil {
		f.t.Fatalf("%s: istio-ca-root-cert as mounted: %v", phase, err)
	}
	snapshot := filepath.Join(f.snapshots, fmt.Sprintf("roots-%d.pem", n))
	writeFile(f.t, snapshot, bundle)
	x := &xdsClient{name: fmt.Sprintf("%s#%d", phase, n), roots: roots}
	cfg := adsc.Config{CertDir: f.certDir, XDSRootCAFile: snapshot, XDSSAN: f.san, Namespace: f.namespace,
		Workload: fmt.Sprintf("%s-%d", f.workload, n)}
	if err := x.dial(f.addr, cfg); err != nil {
		f.t.Fatalf("%s: a new xDS client presenting the agent's certificate, verifying istiod with %d published roots, was not served CDS: %v",
			phase, len(roots), err)
	}
	f.clients = append(f.clients, x)
	f.opened = append(f.opened, phase)
}

// openViaAgent opens a client on the agent's xDS proxy: the agent relays
// to istiod with its own connection (its bearer token, XDS_ROOT_CA).
func (f *xdsFleet) openViaAgent(phase string) {
	f.t.Helper()
	x := &xdsClient{name: phase + "#via-agent"}
	// Plaintext on the Pod's own socket, as for Envoy.
	cfg := adsc.Config{Namespace: f.namespace, Workload: f.workload,
		GrpcOpts: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}
	if err := x.dial("unix://"+f.socket, cfg); err != nil {
		f.t.Fatalf("%s: xDS through the agent's proxy: %v", phase, err)
	}
	f.clients = append(f.clients, x)
	f.opened = append(f.opened, phase)
}

func (f *xdsFleet) held() []*xdsClient {
	var out []*xdsClient
	for _, x := range f.clients {
		x.mu.Lock()
		if !x.closed {
			out = append(out, x)
		}
		x.mu.Unlock()
	}
	return out
}

// reconnected waits until every held client is served again after its
// last stream ended (an istiod rollout ends them all).
func (f *xdsFleet) reconnected(phase string, timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for _, x := range f.held() {
		for !x.connected() {
			if time.Now().After(deadline) {
				_, last, ends, conns := x.state()
				f.t.Fatalf("%s: held xDS client %s did not reconnect within %v: its stream ended at %s, last response %s, %d transports",
					phase, x.name, timeout, ends[len(ends)-1].Format(time.TimeOnly), last.Format(time.TimeOnly), conns)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// push makes istiod push CDS (a new Service in the workload's namespace)
// and waits until every held client got it: their streams are served.
func (f *xdsFleet) push(ctx context.Context, phase string) {
	f.t.Helper()
	f.pushes++
	before := map[*xdsClient]int{}
	held := f.held()
	for _, x := range held {
		before[x], _, _, _ = x.state()
	}
	name := fmt.Sprintf("push-%d", f.pushes)
	_, err := cluster.Client.CoreV1().Services(f.namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			Selector: map[string]string{"app": name}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, x := range held {
		for {
			if cds, _, _, _ := x.state(); cds > before[x] {
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("%s: held xDS client %s got no push within 20s of Service %s/%s", phase, x.name, f.namespace, name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// dropStale closes the held clients whose bundle does not verify chain,
// istiod's certificate now: at istiod's next rollout they would dial the
// new Pod with roots that lack its issuer. A proxy's bundle follows the
// agent's (over SDS); adsc keeps the one it was opened with.
func (f *xdsFleet) dropStale(chain []*x509.Certificate) []string {
	var names []string
	for _, x := range f.held() {
		if x.roots == nil {
			continue
		}
		_, err := chain[0].Verify(x509.VerifyOptions{Roots: certs.Pool(x.roots...), Intermediates: certs.Pool(chain[1:]...),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			x.close()
			f.dropped++
			names = append(names, x.name)
		}
	}
	return names
}

func (f *xdsFleet) closeAll() {
	for _, x := range f.held() {
		x.close()
	}
}

// counts sums what the clients saw: TLS connections established with
// istiod (through the agent, the socket is plaintext and outlives
// istiod's streams), stream ends, and the ends that were followed by a
// response (reconnects).
func (f *xdsFleet) counts() (tlsConns, ends, reconnects int) {
	for _, x := range f.clients {
		_, last, e, conns := x.state()
		if x.roots != nil {
			tlsConns += conns
		}
		ends += len(e)
		reconnects += len(e)
		if len(e) > 0 && !last.After(e[len(e)-1]) {
			reconnects-- // the last end was not followed by a response
		}
	}
	return tlsConns, ends, reconnects
}

// perPhase is how many clients each phase opened: "start 2, prepare 1".
func (f *xdsFleet) perPhase() string {
	var parts []string
	for i, j := 0, 0; i < len(f.opened); i = j {
		for j = i; j < len(f.opened) && f.opened[j] == f.opened[i]; j++ {
		}
		parts = append(parts, fmt.Sprintf("%s %d", f.opened[i], j-i))
	}
	return strings.Join(parts, ", ")
}

// unattributed lists the stream ends that fall outside every istiod
// rollout: a Secret rewrite (istiod reloads its certificate) must not end
// a stream.
func (f *xdsFleet) unattributed(rollouts []rollout) []string {
	var out []string
	for _, x := range f.clients {
		_, _, ends, _ := x.state()
		for _, e := range ends {
			ok := false
			for _, r := range rollouts {
				ok = ok || (r.replaced && !e.Before(r.stopping) && e.Before(r.ended.Add(3*time.Second)))
			}
			if !ok {
				out = append(out, fmt.Sprintf("%s at %s", x.name, e.Format(time.TimeOnly)))
			}
		}
	}
	return out
}
