package chart

import (
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshca/meshca/integration/harness"
	corev1 "k8s.io/api/core/v1"
)

// TestChartNodeProxyDeny: the Deployment passes --node-proxy-deny: the
// values' entries (kube-system by default), then istiod's of every
// revision in istio.namespace, which no value removes. meshca's own
// account is meshca's to deny: it learns it from its credentials.
func TestChartNodeProxyDeny(t *testing.T) {
	ns := "mesh-ca"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"defaults", nil, "--node-proxy-deny=kube-system," + ns + "/istiod," + ns + "/istiod-*"},
		{"istiod elsewhere; a prefix of the values'", []string{"--set", "istio.namespace=istio-system",
			"--set", "istio.istiodCertificate.revision=canary", "--set", "serviceAccount.name=ca",
			"--set", "ca.nodeProxyDeny={kube-system,ops,istio-system/istiod-*,ops/vault-*}"},
			"--node-proxy-deny=kube-system,ops,istio-system/istiod-*,ops/vault-*,istio-system/istiod"},
		{"no entries: the control plane's still", []string{"--set", "ca.nodeProxyDeny=null"},
			"--node-proxy-deny=" + ns + "/istiod," + ns + "/istiod-*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := harness.HelmTemplate(helm, "meshca", ns, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := harness.Objects(out)
			if err != nil {
				t.Fatal(err)
			}
			wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args, []string{tt.want}, nil)
		})
	}
}

// TestChartAdminConnections: monitoring.maxConnections and
// maxConnectionsPerPeer reach --admin-max-connections and
// --admin-max-connections-per-peer, the binary's defaults by default.
func TestChartAdminConnections(t *testing.T) {
	for _, tt := range []struct {
		args, want []string
	}{
		{nil, []string{"--admin-max-connections=128", "--admin-max-connections-per-peer=16"}},
		{[]string{"--set", "monitoring.maxConnections=512", "--set", "monitoring.maxConnectionsPerPeer=0"},
			[]string{"--admin-max-connections=512", "--admin-max-connections-per-peer=0"}},
	} {
		out, err := harness.HelmTemplate(helm, "meshca", "mesh-ca", tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := harness.Objects(out)
		if err != nil {
			t.Fatal(err)
		}
		wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args, tt.want, nil)
	}
}

// TestChartMonitoringBindPodIP: with monitoring.bindPodIP the Deployment
// gives meshca its Pod's IP from the downward API and binds the
// monitoring port to it alone; by default it binds every address. The
// monitoring scenario (ci/monitoring-values.yaml) binds it, next to its
// NetworkPolicy that admits Prometheus alone. meshca, run with the
// Deployment's own arguments under its ServiceAccount, serves /healthz on
// the Pod's IP and nothing on 127.0.0.1 at that port.
func TestChartMonitoringBindPodIP(t *testing.T) {
	ns := cluster.Namespace(t, "chart-bind-pod-ip")
	if c := deployment(t, render(t, ns)).Spec.Template.Spec.Containers[0]; slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" }) {
		t.Errorf("default env %+v: want no POD_IP", c.Env)
	} else {
		wantArgs(t, "serve", c.Args, nil, []string{"--admin-bind-address"})
	}
	monitoring := render(t, ns, "--values", filepath.Join(harness.ChartDir(), "ci", "monitoring-values.yaml"))
	wantArgs(t, "serve", deployment(t, monitoring).Spec.Template.Spec.Containers[0].Args, []string{"--admin-bind-address=$(POD_IP)"}, nil)

	objs := render(t, ns, "--set", "monitoring.bindPodIP=true")
	ctr := deployment(t, objs).Spec.Template.Spec.Containers[0]
	i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" })
	if i < 0 || ctr.Env[i].ValueFrom == nil || ctr.Env[i].ValueFrom.FieldRef == nil || ctr.Env[i].ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Fatalf("env %+v: want POD_IP from status.podIP", ctr.Env)
	}
	args := containerArgs(t, ctr, ns)
	wantArgs(t, "serve", args, []string{"--admin-bind-address=" + podIP}, nil)
	apply(t, objs, false)
	// The port the chart's --admin-listen default gives, 15014, may be
	// taken on a test machine: the kernel picks one.
	m := harness.StartMeshca(t, bin, append(args, "--admin-listen", ":0", "--kubeconfig", cluster.ServiceAccountKubeconfig(t, ns, "meshca"))...)
	host, port, err := net.SplitHostPort(m.AdminAddr)
	if err != nil || host != podIP {
		t.Fatalf("admin address %q (%v), want the Pod's IP %s", m.AdminAddr, err, podIP)
	}
	r, err := http.Get("http://" + m.AdminAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Errorf("/healthz on the Pod's IP: %s", r.Status)
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("127.0.0.1:%s accepted a connection: the monitoring port listens beyond the Pod's IP", port)
	}
}
