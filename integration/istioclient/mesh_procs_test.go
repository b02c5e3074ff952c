package istioclient

// The processes of the mesh: the real istiod (pilot-discovery) and
// istio-agent (pilot-agent), built from Istio's module by
// integration/scripts/istio.sh, each run in a directory of its own that
// stands for its container's filesystem (both read their files relative to
// the working directory: ./var/run/secrets/...).

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
)

// istioLogsEnv names a directory that receives every Istio process's log
// when the test ends, for a look at a run that passed.
const istioLogsEnv = "MESHCA_ISTIO_LOGS"

// istioBinaries builds (once, cached outside the clone) pilot-discovery and
// pilot-agent, and fails the test loudly when they cannot be built: these
// tests exist to run the real ones.
func istioBinaries(t *testing.T) (discoveryBin, agentBin string) {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(harness.ScriptsDir(), "istio.sh"), "build")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("integration/scripts/istio.sh build: %v: the real istiod and istio-agent are required", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) < 2 {
		t.Fatalf("integration/scripts/istio.sh build printed %q, want the paths of pilot-discovery and pilot-agent", out)
	}
	return lines[len(lines)-2], lines[len(lines)-1]
}

// proc is a process with its combined output kept in memory.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *proc) mark() int { return len(p.logs()) }

func (p *proc) since(mark int) string { return p.logs()[mark:] }

func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.logs(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, as the kubelet does, and kills after 20 s.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// saveLog writes the log under $MESHCA_ISTIO_LOGS, when it is set.
func (p *proc) saveLog() {
	dst := os.Getenv(istioLogsEnv)
	if dst == "" {
		return
	}
	_ = os.MkdirAll(dst, 0o755)
	_ = os.WriteFile(filepath.Join(dst, p.name+".log"), []byte(p.logs()), 0o644)
}

// startProc runs bin in dir with only PATH, HOME and env. The caller
// stops it: processes started by a controller's goroutine cannot register
// a test cleanup.
func startProc(name, dir string, env []string, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Dir = dir
	p.cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + dir}, env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// istiod is one istiod Pod's process.
type istiod struct {
	*proc
	dir                  string
	httpAddr, secureAddr string
	httpsAddr            string // the webhooks'
	started              time.Duration
}

var (
	httpAddrRe   = regexp.MustCompile(`starting HTTP service at (\S+)`)
	secureAddrRe = regexp.MustCompile(`starting secure gRPC discovery service at (\S+)`)
	httpsAddrRe  = regexp.MustCompile(`starting webhook service at (\S+)`)
)

// startIstiod runs `pilot-discovery discovery` in dir, which holds
// ./var/run/secrets/istiod/{tls,ca} as its volumes would, on
// kernel-chosen 127.0.0.1 ports read back from its log, and waits for its
// /ready. Without ENABLE_CA_SERVER it neither signs nor publishes
// istio-ca-root-cert: meshca does both. It needs no CRDs.
func startIstiod(ctx context.Context, bin, dir, name, namespace, kubeconfig string) (*istiod, error) {
	start := time.Now()
	// REVISION as istiod's chart sets it: its webhook patchers look
	// for configurations labelled istio.io/rev with it.
	p, err := startProc(name, dir, []string{"ENABLE_CA_SERVER=false", "REVISION=default", "POD_NAMESPACE=" + namespace, "POD_NAME=" + name}, bin,
		"discovery", "--kubeconfig", kubeconfig,
		"--httpAddr", "127.0.0.1:0", "--grpcAddr", "127.0.0.1:0", "--secureGRPCAddr", "127.0.0.1:0",
		// Metrics on the HTTP port (a separate monitoring port is not
		// logged); ControlZ on a kernel-chosen port.
		"--httpsAddr", "127.0.0.1:0", "--monitoringAddr=", "--ctrlz_port", "0",
		// A rollout waits this long for the old Pod's streams, as
		// terminationGracePeriodSeconds would, before they are cut.
		"--shutdownDuration", "2s",
		// grpc:info: a refused TLS handshake is logged only at this level.
		"--log_output_level=default:info,grpc:info")
	if err != nil {
		return nil, err
	}
	d := &istiod{proc: p, dir: dir}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p.exited() {
			return d, fmt.Errorf("%s exited before it was ready: %v\n%s", name, p.cmd.ProcessState, p.tail(40))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.stop()
			return d, fmt.Errorf("%s was not ready within 60s (%v):\n%s", name, ctx.Err(), p.tail(40))
		}
		logs := p.logs()
		if m := httpAddrRe.FindStringSubmatch(logs); m != nil {
			d.httpAddr = m[1]
		}
		if m := secureAddrRe.FindStringSubmatch(logs); m != nil {
			d.secureAddr = m[1]
		}
		if m := httpsAddrRe.FindStringSubmatch(logs); m != nil {
			d.httpsAddr = m[1]
		}
		if d.httpAddr == "" || d.secureAddr == "" || d.httpsAddr == "" {
			continue
		}
		r, err := http.Get("http://" + d.httpAddr + "/ready")
		if err != nil {
			continue
		}
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			d.started = time.Since(start)
			return d, nil
		}
	}
}

// agentSecretTTL is the agent's SECRET_TTL: it renews at half of it
// (SECRET_GRACE_PERIOD_RATIO), and the rotation guards wait for half of
// the longest leaf lifetime, so it sets the pace of the whole test.
const agentSecretTTL = 20 * time.Second

// agent is istio-agent (pilot-agent) of one workload, without Envoy: it
// writes its certificates to OUTPUT_CERTS, and its xDS proxy serves a
// local socket, as it serves Envoy, relaying to istiod.
type agent struct {
	*proc
	dir       string
	out       string // OUTPUT_CERTS
	rootFile  string // istio-ca-root-cert, mounted: CA_ROOT_CA and XDS_ROOT_CA
	xdsSocket string
}

// agentRootDir is where a sidecar mounts istio-ca-root-cert.
const agentRootDir = "var/run/secrets/istio"

// startAgent runs `pilot-agent proxy sidecar` for w in dir, whose
// ./var/run/secrets/istio holds istio-ca-root-cert already: certificates
// from meshca at caAddr, xDS from istiod at xdsAddr (the Service), and
// the variables of env besides.
func startAgent(t *testing.T, bin, dir string, w *harness.Workload, caAddr, xdsAddr, istiodSAN string, env ...string) *agent {
	t.Helper()
	a := &agent{dir: dir, out: filepath.Join(dir, "out"), rootFile: filepath.Join(dir, agentRootDir, "root-cert.pem"),
		xdsSocket: filepath.Join(dir, "etc/istio/proxy/XDS")}
	writeFile(t, filepath.Join(dir, "var/run/secrets/tokens/istio-token"), []byte(w.Token))
	// The agent writes into OUTPUT_CERTS but does not create it.
	if err := os.MkdirAll(a.out, 0o755); err != nil {
		t.Fatal(err)
	}
	_, caPort, _ := net.SplitHostPort(caAddr)
	p, err := startProc("pilot-agent", dir, append([]string{
		"DISABLE_ENVOY=true",
		// "localhost" makes the agent verify the name
		// istiod.istio-system.svc (pilot/pkg/grpc/tls.go), which meshca's
		// serving certificate carries by default: CA_ADDR takes no SAN of
		// its own.
		"CA_ADDR=localhost:" + caPort,
		"CA_ROOT_CA=" + a.rootFile,
		"XDS_ROOT_CA=" + a.rootFile,
		"ISTIOD_SAN=" + istiodSAN,
		fmt.Sprintf("PROXY_CONFIG={discoveryAddress: '%s', statusPort: %d}", xdsAddr, freePort(t)),
		"POD_NAME=" + w.Pod, "POD_NAMESPACE=" + w.Namespace, "SERVICE_ACCOUNT=" + w.ServiceAccount,
		"INSTANCE_IP=127.0.0.1", "ISTIO_META_CLUSTER_ID=" + clusterID,
		"OUTPUT_CERTS=" + a.out,
		"SECRET_TTL=" + agentSecretTTL.String(),
	}, env...), bin, "proxy", "sidecar")
	if err != nil {
		t.Fatal(err)
	}
	a.proc = p
	t.Cleanup(func() {
		p.stop()
		p.saveLog()
		if t.Failed() {
			t.Logf("pilot-agent log tail:\n%s", p.tail(40))
		}
	})
	return a
}

// freePort is a TCP port free now on every interface: the agent's status
// port cannot be 0 (its validation refuses it) and listens on all of them.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// writeFile replaces path (creating its directory) by a rename.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
