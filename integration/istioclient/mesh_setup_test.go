package istioclient

// The mesh of TestIstioMeshThroughRootRotations, assembled: namespaces,
// istiod's Deployment, a workload, meshca, and the stand-ins of
// mesh_kube_test.go running the real istiod and istio-agent.

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	istiolog "istio.io/istio/pkg/log"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
)

const (
	// rootConfigMap is Istio's name for the bundle meshca publishes to
	// every namespace, under rootKey.
	rootConfigMap = "istio-ca-root-cert"
	rootKey       = "root-cert.pem"
	// trustedRootsAnnotation, on istiod's pod template, lists the
	// fingerprints of the roots its Pods start with: meshca patches it to
	// restart istiod when the roots grow.
	trustedRootsAnnotation = "meshca.io/trusted-roots"

	istiodSecret     = "istiod-tls"
	istiodDeployment = "istiod"
	// istiodCertTTL is short so that the keeper renews istiod's
	// certificate (at two thirds of it) several times during the test:
	// each renewal is a Secret rewrite istiod must take without dropping
	// a stream.
	istiodCertTTL = 20 * time.Second
)

// mesh is one run's cluster objects and processes.
type mesh struct {
	t                 *testing.T
	ctx               context.Context
	istiodNS, appNS   string
	selector          string
	stateDir          string
	podsDir           string // the Pods' filesystems
	meshca            *harness.Meshca
	meshcaAddr        string // kept across restarts: the agent dials it
	kube              *kubelet
	svc               *service
	dep               *deployer
	agent             *agent
	certs             *certWatcher
	xds               *xdsFleet
	hooks             *webhooks           // istiod's webhooks, called by the apiserver
	probe             *istiodProber       // fresh TLS connections to istiod's xDS port
	hookProbe         *istiodProber       // and to its webhooks' port
	hookFigures       string              // hookProbe's, once judged
	roots             []*x509.Certificate // every root published, in order
	mu                sync.Mutex          // guards the two below, which the kubelet's goroutine writes
	rewrites          []time.Time         // new istiod certificates the kubelet wrote
	seenLeaves        map[string]bool
	refusals          map[string][]string // verb → why each refusal was given
	handshakeMark     int                 // clientHandshakes before the mesh started
	meshcaRestartedAt time.Time
	hooksPatchedAt    time.Time // istiod first patched its webhooks' caBundle
	agentStarted      time.Time
}

// istiodSAN is the name on istiod's certificate: meshca's default for
// --istiod-cert-secret in istiod's namespace.
func (m *mesh) istiodSAN() string { return "istiod." + m.istiodNS + ".svc" }

// newMesh assembles the mesh, with one istiod Pod running and the agent
// holding its first certificate.
func newMesh(t *testing.T, discoveryBin, agentBin string) *mesh {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m := &mesh{t: t, ctx: ctx, stateDir: filepath.Join(t.TempDir(), "state"), podsDir: t.TempDir(), seenLeaves: map[string]bool{},
		refusals: map[string][]string{}, handshakeMark: clientHandshakes.mark()}
	// adsc logs every response at info level.
	istiolog.FindScope("adsc").SetOutputLevel(istiolog.WarnLevel)

	m.istiodNS = cluster.Namespace(t, "istiod")
	m.appNS = cluster.Namespace(t, "mesh-app")
	m.selector = "meshca-mesh-test=" + m.istiodNS
	for _, ns := range []string{m.istiodNS, m.appNS} {
		m.label(ns)
	}
	m.createDeployment()
	m.hooks = installWebhooks(t, ctx, m.istiodNS)
	w := cluster.NewWorkload(t, m.appNS, "app", "node-1")

	m.startMeshca("--auto-rotate=false")
	m.waitFor("meshca's first writes", 30*time.Second, func() string {
		switch {
		case m.secret().leaf() == nil:
			return "no istiod certificate in the Secret"
		case len(m.published(m.istiodNS)) != 1 || len(m.published(m.appNS)) != 1:
			return "istio-ca-root-cert not published to both namespaces"
		case len(m.annotatedRoots()) != 1:
			return "the Deployment's pod template does not list the root istiod must start with"
		}
		return ""
	})
	m.roots = m.published(m.appNS)

	m.kube = newKubelet(cluster.Client, m.observeWrite)
	go m.kube.run(ctx)
	m.svc = startService(t)
	m.dep = &deployer{client: cluster.Client, namespace: m.istiodNS, name: istiodDeployment, svc: m.svc, hooks: m.hooks.hooks,
		newPod: func(ctx context.Context, n int) (*istiod, func(), error) { return m.startPod(ctx, discoveryBin, n) }}
	stopped := make(chan struct{})
	go func() { m.dep.run(ctx); close(stopped) }()
	t.Cleanup(func() {
		cancel()
		<-stopped
		_, pods, _ := m.dep.snapshot()
		for _, p := range pods {
			p.saveLog()
		}
		if t.Failed() && len(pods) > 0 {
			t.Logf("%s log tail:\n%s", pods[len(pods)-1].name, pods[len(pods)-1].tail(40))
		}
	})
	m.waitFor("the first istiod Pod", 60*time.Second, func() string {
		if rollouts, _, errs := m.dep.snapshot(); len(rollouts) == 0 {
			return "not rolled out yet " + strings.Join(errs, "; ")
		}
		return ""
	})

	agentDir := t.TempDir()
	if _, err := m.kube.mount(ctx, filepath.Join(agentDir, agentRootDir), rootSource(m.appNS)); err != nil {
		t.Fatal(err)
	}
	m.agentStarted = time.Now()
	m.agent = startAgent(t, agentBin, agentDir, w, m.meshcaAddr, m.svc.addr(), m.istiodSAN())
	m.certs = &certWatcher{dir: m.agent.out, namespace: m.appNS, id: spiffeID(w)}
	go m.certs.run(ctx)
	m.certs.waitUnder(t, m.roots[0], 30*time.Second)

	m.xds = &xdsFleet{t: t, addr: m.svc.addr(), san: m.istiodSAN(), certDir: m.agent.out, rootFile: m.agent.rootFile,
		namespace: m.appNS, workload: w.Pod, socket: m.agent.xdsSocket, snapshots: t.TempDir()}
	t.Cleanup(m.xds.closeAll)

	m.waitFor("istiod patched its webhooks", 30*time.Second, func() string { return m.hooks.patched(ctx, m.published(m.istiodNS)) })
	m.hooksPatchedAt = time.Now()
	go m.hooks.run(ctx)
	m.probe = startProber(probeTarget{name: "root-cert.pem as mounted", addr: m.svc.addr(), san: m.istiodSAN(),
		roots: mountedRoots(m.agent.rootFile)})
	t.Cleanup(m.probe.stop)
	m.hookProbe = startProber(m.hooks.targets(ctx)...)
	t.Cleanup(m.hookProbe.stop)
	return m
}

// label puts ns under meshca's --trust-namespace-selector.
func (m *mesh) label(ns string) {
	obj, err := cluster.Client.CoreV1().Namespaces().Get(m.ctx, ns, metav1.GetOptions{})
	if err != nil {
		m.t.Fatal(err)
	}
	obj.Labels = map[string]string{"meshca-mesh-test": m.istiodNS}
	if _, err := cluster.Client.CoreV1().Namespaces().Update(m.ctx, obj, metav1.UpdateOptions{}); err != nil {
		m.t.Fatal(err)
	}
}

// createDeployment stores istiod's Deployment: one replica, whose Pods
// the deployer runs.
func (m *mesh) createDeployment() {
	one := int32(1)
	labels := map[string]string{"app": "istiod"}
	_, err := cluster.Client.AppsV1().Deployments(m.istiodNS).Create(m.ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: istiodDeployment},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "discovery", Image: "example.invalid/pilot:1"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		m.t.Fatalf("create istiod's Deployment: %v", err)
	}
}

// startMeshca runs meshca serve on the state directory, keeping istiod's
// Secret and Deployment, publishing istio-ca-root-cert to both
// namespaces, on the same gRPC address as before when it restarts.
func (m *mesh) startMeshca(extra ...string) {
	args := []string{"--state-dir", m.stateDir, "--kubeconfig", cluster.Kubeconfig,
		"--istiod-cert-secret", m.istiodNS + "/" + istiodSecret, "--istiod-deployment", istiodDeployment,
		"--istiod-cert-ttl", istiodCertTTL.String(), "--backdate=1s",
		"--publish-root-cert-configmaps", "--trust-namespace-selector", m.selector, "--trust-lease-namespace", m.istiodNS}
	if m.meshcaAddr != "" {
		args = append(args, "--listen", m.meshcaAddr) // after the harness's 127.0.0.1:0: the last one wins
	}
	m.meshca = harness.StartMeshca(m.t, bin, append(args, extra...)...)
	m.meshcaAddr = m.meshca.Addr
}

// rootSource is istio-ca-root-cert of ns, as a volume.
func rootSource(ns string) source {
	return source{namespace: ns, name: rootConfigMap, files: map[string]string{rootKey: "root-cert.pem"}}
}

// startPod starts istiod Pod n: its volumes mounted (the kubelet reads
// the objects afresh, as for a new Pod), then the process.
func (m *mesh) startPod(ctx context.Context, bin string, n int) (*istiod, func(), error) {
	dir, err := os.MkdirTemp(m.podsDir, "pod-")
	if err != nil {
		return nil, nil, err
	}
	tlsVol, err := m.kube.mount(ctx, filepath.Join(dir, "var/run/secrets/istiod/tls"), source{secret: true,
		namespace: m.istiodNS, name: istiodSecret, files: map[string]string{"tls.crt": "tls.crt", "tls.key": "tls.key", "ca.crt": "ca.crt"}})
	if err != nil {
		return nil, nil, err
	}
	caVol, err := m.kube.mount(ctx, filepath.Join(dir, "var/run/secrets/istiod/ca"), rootSource(m.istiodNS))
	if err != nil {
		m.kube.unmount(tlsVol)
		return nil, nil, err
	}
	unmount := func() { m.kube.unmount(tlsVol, caVol) }
	p, err := startIstiod(ctx, bin, dir, fmt.Sprintf("istiod-%d", n), m.istiodNS, cluster.Kubeconfig)
	if err != nil {
		unmount()
		if p != nil {
			p.saveLog()
		}
		return nil, nil, err
	}
	return p, unmount, nil
}

// observeWrite counts the istiod certificates the kubelet wrote into a
// Pod's files after they were mounted: each is a Secret rewrite a running
// istiod reloads.
func (m *mesh) observeWrite(v *volume) {
	m.mu.Lock()
	defer m.mu.Unlock()
	crt, ok := v.current["tls.crt"]
	if !ok || m.seenLeaves[string(crt)] {
		return
	}
	m.seenLeaves[string(crt)] = true
	m.rewrites = append(m.rewrites, time.Now())
}

// held is what istiod's Secret holds: its certificate chain (tls.crt)
// and the roots it verifies proxies with (ca.crt).
type held struct {
	Chain, Roots []*x509.Certificate
}

func (h held) leaf() *x509.Certificate {
	if len(h.Chain) == 0 {
		return nil
	}
	return h.Chain[0]
}

// secret is istiod's Secret now (empty when it cannot be read).
func (m *mesh) secret() held {
	sec, err := cluster.Client.CoreV1().Secrets(m.istiodNS).Get(m.ctx, istiodSecret, metav1.GetOptions{})
	if err != nil {
		return held{}
	}
	chain, _ := pemutil.ParseCertificates(sec.Data["tls.crt"])
	roots, _ := pemutil.ParseCertificates(sec.Data["ca.crt"])
	return held{Chain: chain, Roots: roots}
}

// published is istio-ca-root-cert's bundle in ns now.
func (m *mesh) published(ns string) []*x509.Certificate {
	cm, err := cluster.Client.CoreV1().ConfigMaps(ns).Get(m.ctx, rootConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	roots, _ := pemutil.ParseCertificates([]byte(cm.Data[rootKey]))
	return roots
}

// annotatedRoots are the roots the Deployment's pod template lists.
func (m *mesh) annotatedRoots() []string {
	d, err := cluster.Client.AppsV1().Deployments(m.istiodNS).Get(m.ctx, istiodDeployment, metav1.GetOptions{})
	if err != nil || d.Spec.Template.Annotations[trustedRootsAnnotation] == "" {
		return nil
	}
	return strings.Split(d.Spec.Template.Annotations[trustedRootsAnnotation], ",")
}

// waitFor polls ok until it says "" and fails the test with its last
// word after timeout.
func (m *mesh) waitFor(what string, timeout time.Duration, ok func() string) {
	m.t.Helper()
	var why string
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		if why = ok(); why == "" {
			return
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("%s: not within %v: %s", what, timeout, why)
		}
	}
}

// rootStep runs `meshca root args...` and returns its output and exit
// code.
func (m *mesh) rootStep(args ...string) (string, int) {
	m.t.Helper()
	out, err := exec.Command(bin, append([]string{"root"}, args...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		m.t.Fatal(err)
	}
	return string(out), 0
}
