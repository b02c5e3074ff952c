package chart

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The scenarios' checks: what each values file must change in the
// rendering, and what the defaults must be.

func checkDefaults(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	want := map[string]int{"ServiceAccount": 2, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 2, "RoleBinding": 2,
		"Secret": 1, "Deployment": 1, "Service": 1, "PodDisruptionBudget": 1, "CronJob": 2}
	if got := kinds(objs); !maps.Equal(got, want) {
		t.Errorf("rendered kinds %v, want %v", got, want)
	}
	d := deployment(t, objs)
	if *d.Spec.Replicas != 2 || d.Spec.Strategy.Type != "RollingUpdate" {
		t.Errorf("replicas %d strategy %s: want 2 and RollingUpdate", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "ghcr.io/meshca/meshca:v0.1.0" {
		t.Errorf("image %s: want the appVersion's tag", c.Image)
	}
	wantArgs(t, "serve", c.Args, []string{"serve", "--state-secret=" + ns + "/meshca-ca-state", "--trust-domain=cluster.local",
		"--trusted-node-accounts=istio-system/ztunnel", "--token-audiences=istio-ca", "--default-ttl=24h", "--max-ttl=2160h",
		"--serving-dns-names=istiod." + ns + ".svc,meshca." + ns + ".svc", "--auto-rotate=true", "--remote-secret-namespace="},
		// Beside an istiod that runs its own CA, meshca writes nothing of
		// Istio's: neither istio-ca-root-cert, istio-ca-crl nor istiod's
		// certificate.
		[]string{"--state-dir", "--signer", "--publish-cluster-trust-bundle", "--remote-secret-namespace=" + ns,
			"--publish-root-cert-configmaps", "--publish-crl", "--istiod-cert-secret", "--crl"})
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port != intstr.FromString("http-monitoring") {
			t.Errorf("probe %+v: want an HTTP probe on the monitoring port", p)
		}
	}
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("affinity %+v: want soft anti-affinity across nodes", a)
	}
	if p := pdb(t, objs); p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 || p.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %+v: want maxUnavailable 1", p.Spec)
	}
	s := find(t, objs, "Secret", "meshca-ca-state")
	if s.GetAnnotations()["helm.sh/resource-policy"] != "keep" || s.Object["data"] != nil || s.GetLabels()["app.kubernetes.io/managed-by"] != "" {
		t.Errorf("state Secret %v: want empty, kept on uninstall, without a managed-by label (Helm lets it go after install; meshca never relabels it)", s.Object)
	}
	wantRules(t, "ClusterRole meshca", clusterRole(t, objs).Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	})
	wantRules(t, "Role meshca", role(t, objs, "meshca").Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"meshca-root-rotator"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"meshca-ca-state"}, Verbs: []string{"get", "update"}},
	})
	wantRules(t, "Role meshca-root-rotation", role(t, objs, "meshca-root-rotation").Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"meshca-ca-state"}, Verbs: []string{"get", "update"}},
	})
	for _, step := range []string{"retire", "activate"} {
		checkRotationJob(t, cronJob(t, objs, step), step, ns)
	}
}

// checkRotationJob: suspended, never two at once, history kept, a guard's
// refusal (exit 1) fails the Job without retries, under its own account.
func checkRotationJob(t *testing.T, c *batchv1.CronJob, step, ns string) {
	t.Helper()
	j := c.Spec.JobTemplate.Spec
	if c.Spec.Suspend == nil || !*c.Spec.Suspend || c.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent ||
		*c.Spec.SuccessfulJobsHistoryLimit != 3 || *c.Spec.FailedJobsHistoryLimit != 3 {
		t.Errorf("CronJob %s %+v: want suspended, Forbid, history 3/3", c.Name, c.Spec)
	}
	if *j.BackoffLimit != 2 || *j.ActiveDeadlineSeconds != 300 || j.Template.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		j.Template.Spec.ServiceAccountName != "meshca-root-rotation" {
		t.Errorf("CronJob %s job %+v: want backoffLimit 2, deadline 300s, restart Never, ServiceAccount meshca-root-rotation", c.Name, j)
	}
	if r := j.PodFailurePolicy.Rules[0]; r.Action != batchv1.PodFailurePolicyActionFailJob || !slices.Equal(r.OnExitCodes.Values, []int32{1}) {
		t.Errorf("CronJob %s podFailurePolicy %+v: want exit code 1 to fail the Job", c.Name, j.PodFailurePolicy)
	}
	wantArgs(t, c.Name, j.Template.Spec.Containers[0].Args, []string{"root", step, "--state-secret=" + ns + "/meshca-ca-state", "--margin=5m"}, nil)
}

// checkClusterRole: the ClusterRole grants exactly these resources, and
// never Secrets.
func checkClusterRole(t *testing.T, r *rbacv1.ClusterRole, resources []string) {
	t.Helper()
	var got []string
	for _, rule := range r.Rules {
		got = append(got, rule.Resources...)
	}
	if !slices.Equal(got, resources) {
		t.Errorf("ClusterRole resources %q, want %q", got, resources)
	}
}

func wantRules(t *testing.T, what string, got, want []rbacv1.PolicyRule) {
	t.Helper()
	if !slices.EqualFunc(got, want, func(a, b rbacv1.PolicyRule) bool {
		return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
			slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.Verbs, b.Verbs)
	}) {
		t.Errorf("%s rules %+v, want %+v", what, got, want)
	}
}

func checkHA(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	if *d.Spec.Replicas != 3 || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("replicas %d strategy %+v: want 3 with maxUnavailable 0", *d.Spec.Replicas, d.Spec.Strategy)
	}
	checkRemoteSecrets(t, ns, objs)
	if p := pdb(t, objs); p.Spec.MinAvailable == nil || p.Spec.MinAvailable.IntValue() != 2 || p.Spec.MaxUnavailable != nil {
		t.Errorf("PodDisruptionBudget %+v: want minAvailable 2 alone", p.Spec)
	}
}

// checkRemoteSecrets: remote-cluster Secrets are watched in a namespace of
// their own, the chart's, where meshca may list and watch Secrets and do
// nothing else; its Role in the release namespace names every Secret it
// may touch.
func checkRemoteSecrets(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	r := role(t, objs, "meshca-remote-secrets")
	remote := r.Namespace
	if remote == ns || remote == "istio-system" || remote == "" {
		t.Fatalf("Role meshca-remote-secrets in namespace %q: want a namespace of its own", remote)
	}
	wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args,
		[]string{"--state-secret=" + ns + "/meshca-ca-state", "--remote-secret-namespace=" + remote}, nil)
	if n := find(t, objs, "Namespace", remote); n.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("Namespace %s %v: want it kept on uninstall, with the Secrets put there", remote, n.GetAnnotations())
	}
	wantRules(t, "Role meshca-remote-secrets", r.Rules, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}},
	})
	var b rbacv1.RoleBinding
	convert(t, find(t, objs, "RoleBinding", "meshca-remote-secrets"), &b)
	if b.Namespace != remote || b.RoleRef.Name != r.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != "meshca" || b.Subjects[0].Namespace != ns {
		t.Errorf("RoleBinding %+v: want the Role bound to meshca's ServiceAccount in %s", b, ns)
	}
	for _, p := range role(t, objs, "meshca").Rules {
		if slices.Contains(p.Resources, "secrets") && len(p.ResourceNames) == 0 {
			t.Errorf("Role meshca rule %+v: Secrets of the release namespace not by name", p)
		}
	}
}

func checkVault(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--signer=vault", "--vault-addr=https://vault.vault.svc:8200",
		"--vault-pki-mount=pki_int", "--vault-role=spiffe", "--vault-rsa-role=spiffe-rsa", "--vault-ca-file=/etc/meshca/vault-tls-ca/ca.crt",
		"--vault-approle-role-id=0b3d1e0c-meshca", "--vault-approle-secret-id-file=/etc/meshca/vault-approle/secret-id", "--vault-approle-mount=approle",
		"--serving-cert-file=/etc/meshca/serving/tls.crt", "--serving-key-file=/etc/meshca/serving/tls.key", "--state-secret=" + ns + "/meshca-ca-state"},
		[]string{"--vault-token-file", "--vault-kubernetes-role", "--trust-anchors"})
	wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{
		"serving": "meshca-serving", "vault-tls-ca": "vault-ca", "vault-approle": "meshca-vault-approle"})
	j := cronJob(t, objs, "activate").Spec.JobTemplate.Spec.Template.Spec
	wantArgs(t, "root activate", j.Containers[0].Args, []string{"--signer=vault", "--vault-addr=https://vault.vault.svc:8200",
		"--vault-approle-secret-id-file=/etc/meshca/vault-approle/secret-id", "--margin=5m"}, []string{"--serving-cert-file", "--trust-anchors"})
	wantSecretVolumes(t, "CronJob", j.Volumes, map[string]string{"vault-tls-ca": "vault-ca", "vault-approle": "meshca-vault-approle"})
}

func checkCfssl(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--signer=cfssl", "--cfssl-url=https://cfssl.pki.svc:8888",
		"--cfssl-profile=spiffe", "--cfssl-key-encipherment-profile=spiffe-rsa", "--cfssl-auth-key-file=/etc/meshca/cfssl-auth/auth-key",
		"--cfssl-tls-ca-file=/etc/meshca/cfssl-tls-ca/ca.crt", "--trust-anchors=/etc/meshca/trust-anchors/roots.pem"},
		[]string{"--state-secret", "--state-dir", "--auto-rotate"})
	wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"serving": "meshca-serving",
		"trust-anchors": "mesh-roots", "cfssl-auth": "meshca-cfssl-auth", "cfssl-tls-ca": "cfssl-ca"})
	if k := kinds(objs); k["CronJob"] != 0 || k["Secret"] != 0 || k["Role"] != 0 {
		t.Errorf("rendered kinds %v: a pinned trust bundle has no CA state to rotate or store, and nothing is elected", k)
	}
}

// wantSecretVolumes: the volumes are exactly these, name → Secret.
func wantSecretVolumes(t *testing.T, what string, vols []corev1.Volume, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, v := range vols {
		if v.Secret == nil {
			t.Errorf("%s volume %s is not a Secret", what, v.Name)
			continue
		}
		got[v.Name] = v.Secret.SecretName
	}
	if !maps.Equal(got, want) {
		t.Errorf("%s Secret volumes %v, want %v", what, got, want)
	}
}

func checkScheduling(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	p := deployment(t, objs).Spec.Template.Spec
	d := deployment(t, objs)
	switch {
	case p.NodeSelector["node-role.example/mesh"] != "true" || p.NodeSelector["kubernetes.io/os"] != "linux":
		t.Errorf("nodeSelector %v", p.NodeSelector)
	case len(p.Tolerations) != 1 || p.Tolerations[0].Key != "dedicated" || p.Tolerations[0].Effect != corev1.TaintEffectNoSchedule:
		t.Errorf("tolerations %+v", p.Tolerations)
	case p.Affinity.NodeAffinity == nil || len(p.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(p.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0:
		t.Errorf("affinity %+v: want the values' own, replacing the default", p.Affinity)
	case len(p.TopologySpreadConstraints) != 1 || p.TopologySpreadConstraints[0].LabelSelector == nil ||
		p.TopologySpreadConstraints[0].LabelSelector.MatchLabels["app.kubernetes.io/instance"] != "meshca":
		t.Errorf("topologySpreadConstraints %+v: want the Pod selector filled in", p.TopologySpreadConstraints)
	case p.PriorityClassName != "system-cluster-critical":
		t.Errorf("priorityClassName %q", p.PriorityClassName)
	case d.Spec.Strategy.RollingUpdate.MaxSurge.String() != "25%" || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 1:
		t.Errorf("strategy %+v", d.Spec.Strategy)
	case p.Containers[0].Resources.Limits.Cpu().String() != "1" || p.Containers[0].Resources.Requests.Memory().String() != "128Mi":
		t.Errorf("resources %+v", p.Containers[0].Resources)
	case d.Spec.Template.Annotations["example.com/team"] != "mesh" || d.Spec.Template.Labels["example.com/tier"] != "control-plane":
		t.Errorf("pod metadata %+v", d.Spec.Template.ObjectMeta)
	}
	c := cronJob(t, objs, "retire")
	if c.Spec.TimeZone == nil || *c.Spec.TimeZone != "Etc/UTC" || c.Spec.JobTemplate.Spec.Template.Spec.NodeSelector["node-role.example/mesh"] != "true" {
		t.Errorf("CronJob %+v: want the time zone and the node selector", c.Spec)
	}
}

func checkMonitoring(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	sm := find(t, objs, "ServiceMonitor", "meshca")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "http-monitoring" || eps[0].(map[string]any)["interval"] != "15s" {
		t.Errorf("ServiceMonitor endpoints %v: want port http-monitoring every 15s", eps)
	}
	if sm.GetLabels()["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v: want release=prometheus", sm.GetLabels())
	}
	groups, _, _ := unstructured.NestedSlice(find(t, objs, "PrometheusRule", "meshca").Object, "spec", "groups")
	if len(groups) == 0 {
		t.Error("PrometheusRule has no rule groups")
	}
	cm := find(t, objs, "ConfigMap", "meshca-dashboard")
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetAnnotations()["grafana_folder"] != "Istio" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", cm.GetLabels(), cm.GetAnnotations())
	}
	checkNetworkPolicy(t, objs)
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "meshca.json")
	var dash struct {
		Title string `json:"title"`
	}
	if err := json.Unmarshal([]byte(raw), &dash); err != nil || dash.Title == "" {
		t.Errorf("dashboard meshca.json is not a titled Grafana dashboard: %v", err)
	}
}

// checkNetworkPolicy: ingress only, to meshca's Pods (not the rotation
// Jobs), the gRPC port from the Pods of every namespace, the monitoring
// port from Prometheus in the monitoring namespace; the ports are the
// container's.
func checkNetworkPolicy(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var np networkingv1.NetworkPolicy
	convert(t, find(t, objs, "NetworkPolicy", "meshca"), &np)
	d := deployment(t, objs)
	if !maps.Equal(np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("NetworkPolicy selects %v, want the Deployment's Pods %v", np.Spec.PodSelector.MatchLabels, d.Spec.Selector.MatchLabels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v, want Ingress only", np.Spec.PolicyTypes)
	}
	ports := map[string]bool{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	want := []struct {
		port string
		from string
	}{
		{"grpc-ca", `[{"namespaceSelector":{}}]`},
		{"http-monitoring", `[{"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}},"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
	}
	if len(np.Spec.Ingress) != len(want) {
		t.Fatalf("ingress rules %+v, want %d", np.Spec.Ingress, len(want))
	}
	for i, w := range want {
		r := np.Spec.Ingress[i]
		from, _ := json.Marshal(r.From)
		if len(r.Ports) != 1 || r.Ports[0].Port == nil || r.Ports[0].Port.String() != w.port || !ports[w.port] || string(from) != w.from {
			t.Errorf("ingress rule %d: ports %v from %s, want the container's port %s from %s", i, r.Ports, from, w.port, w.from)
		}
	}
}

// checkUpstream: upstream.type reaches serve's flags with the
// intermediate's lifetime and renewal point, beside the CA state Secret
// the replicas share.
func checkUpstream(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	wantArgs(t, "serve", deployment(t, objs).Spec.Template.Spec.Containers[0].Args,
		[]string{"--state-secret=" + ns + "/meshca-ca-state", "--upstream=self", "--intermediate-ttl=48h", "--intermediate-renew-at=0.4"}, []string{"--signer"})
}

// checkVaultPKIUpstream: the vault-pki upstream logs in with the Vault
// flags the signer uses, from Secrets mounted as files, and names its
// mount and issuer; no Vault signer.
func checkVaultPKIUpstream(t *testing.T, _ string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--upstream=vault-pki", "--intermediate-ttl=24h",
		"--vault-addr=https://vault.vault.svc:8200", "--vault-ca-file=/etc/meshca/vault-tls-ca/ca.crt",
		"--vault-token-file=/etc/meshca/vault-token/token", "--vault-pki-mount=pki-mesh", "--vault-pki-issuer=mesh-intermediate"},
		[]string{"--signer", "--vault-role", "--vault-transit"})
	wantSecretVolumes(t, "serve", d.Spec.Template.Spec.Volumes, map[string]string{"vault-tls-ca": "vault-ca", "vault-token": "meshca-vault-token"})
}

// checkVaultTransitUpstream: the vault-transit upstream logs in with
// Vault's Kubernetes auth method and a token projected for Vault's
// audience.
func checkVaultTransitUpstream(t *testing.T, _ string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--upstream=vault-transit",
		"--vault-addr=https://vault.vault.svc:8200", "--vault-kubernetes-role=meshca",
		"--vault-kubernetes-token-file=/var/run/secrets/vault/token", "--vault-transit-mount=transit"},
		[]string{"--signer", "--vault-transit-key", "--vault-pki-issuer", "--vault-token-file"})
	var projected bool
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "vault-sa-token" && v.Projected != nil && len(v.Projected.Sources) == 1 &&
			v.Projected.Sources[0].ServiceAccountToken != nil && v.Projected.Sources[0].ServiceAccountToken.Audience == "vault" {
			projected = true
		}
	}
	if !projected {
		t.Error("no service-account token projected for audience vault")
	}
}

// checkPKCS11: upstream.type pkcs11 runs the HSM build, in the server and
// the rotation Jobs alike, with the module, the token and the PIN's file
// from its Secret; never the PIN in an environment variable.
func checkPKCS11(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	c := d.Spec.Template.Spec.Containers[0]
	wantArgs(t, "serve", c.Args, []string{"--upstream=pkcs11", "--pkcs11-module=/opt/hsm/lib/libvendor-pkcs11.so",
		"--pkcs11-token-label=meshca", "--pkcs11-pin-file=/etc/meshca/pkcs11-pin/user-pin", "--state-secret=" + ns + "/meshca-ca-state"},
		[]string{"--pkcs11-slot", "--signer"})
	vols := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols["pkcs11-pin"]; v.Secret == nil || v.Secret.SecretName != "meshca-hsm-pin" || len(vols) != 2 || vols["hsm-client"].HostPath == nil {
		t.Errorf("volumes %v: want the PIN's Secret meshca-hsm-pin and the module's hsm-client alone", slices.Collect(maps.Keys(vols)))
	}
	for _, e := range c.Env {
		if strings.Contains(e.Name, "PIN") {
			t.Errorf("serve's environment has %s: the PIN is a file", e.Name)
		}
	}
	want := "ghcr.io/meshca/meshca-hsm:"
	if !strings.HasPrefix(c.Image, want) {
		t.Errorf("serve runs %s, want the HSM build %s...", c.Image, want)
	}
	for _, step := range []string{"activate", "retire"} {
		if img := cronJob(t, objs, step).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Image; img != c.Image {
			t.Errorf("root %s runs %s, not serve's %s", step, img, c.Image)
		}
	}
}
