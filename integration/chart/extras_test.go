package chart

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// extrasValues bend the chart without a fork: a proxy for the signer
// (extraEnv, a CA bundle from extraVolumes), commonLabels, and
// extraObjects as a string and as a map, both rendered with tpl. Istio
// mode, the NetworkPolicy and the dashboard add objects for commonLabels
// to reach.
const extrasValues = `
commonLabels: {example.com/team: mesh, cost-center: "42"}
podLabels: {example.com/tier: control-plane}
extraEnv:
- {name: HTTPS_PROXY, value: "http://proxy.example:3128"}
- name: PROXY_TOKEN
  valueFrom: {secretKeyRef: {name: proxy, key: token, optional: true}}
extraVolumes:
- name: proxy-ca
  configMap: {name: proxy-ca, optional: true}
extraVolumeMounts:
- {name: proxy-ca, mountPath: /etc/proxy-ca, readOnly: true}
extraObjects:
- |
  apiVersion: v1
  kind: ConfigMap
  metadata:
    name: '{{ include "meshca.fullname" . }}-proxy-ca'
    namespace: '{{ .Release.Namespace }}'
    labels: {cost-center: own}
  data: {trustDomain: '{{ .Values.ca.trustDomain }}'}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: "{{ .Release.Name }}-extra", namespace: "{{ .Release.Namespace }}"}
  data: {replicas: "{{ .Values.replicaCount }}"}
istio: {enabled: true}
networkPolicy: {enabled: true}
grafanaDashboard: {enabled: true}
`

// TestChartExtras: extraEnv, extraVolumes and extraVolumeMounts reach
// meshca's container and the root rotation Jobs' (both dial the signer);
// commonLabels every object and every Pod template, never a selector;
// extraObjects render through tpl with commonLabels added, their own
// labels winning. The rendering applies for real, and the apiserver keeps
// the labels.
func TestChartExtras(t *testing.T) {
	ns := cluster.Namespace(t, "chart-extras")
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(extrasValues), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := render(t, ns, "--values", file)
	// Not checkPodSecurity: HTTPS_PROXY is a literal value on purpose.
	checkPodSelectors(t, objs)

	common := map[string]string{"example.com/team": "mesh", "cost-center": "42"}
	hasCommon := func(what string, l map[string]string, own ...string) {
		t.Helper()
		for k, v := range common {
			if slices.Contains(own, k) {
				continue
			}
			if l[k] != v {
				t.Errorf("%s labels %v: want %s=%s", what, l, k, v)
			}
		}
	}
	for _, o := range objs {
		if o.GetName() == "meshca-proxy-ca" {
			continue // its own cost-center, below
		}
		hasCommon(o.GetKind()+" "+o.GetName(), o.GetLabels())
	}
	want := map[string]bool{"Secret meshca-ca-state": false, "Secret istiod-tls": false, "CronJob meshca-root-retire": false,
		"ClusterRole meshca": false, "RoleBinding meshca-root-rotation": false, "NetworkPolicy meshca": false, "ConfigMap meshca-dashboard": false}
	for _, o := range objs {
		if _, ok := want[o.GetKind()+" "+o.GetName()]; ok {
			want[o.GetKind()+" "+o.GetName()] = true
		}
	}
	for what, ok := range want {
		if !ok {
			t.Errorf("no %s rendered: the values should make one for commonLabels to reach", what)
		}
	}

	d := deployment(t, objs)
	hasCommon("Deployment Pod template", d.Spec.Template.Labels)
	if d.Spec.Template.Labels["example.com/tier"] != "control-plane" {
		t.Errorf("Deployment Pod labels %v: want podLabels' too", d.Spec.Template.Labels)
	}
	for k := range common {
		if _, ok := d.Spec.Selector.MatchLabels[k]; ok {
			t.Errorf("Deployment selector %v holds commonLabels' %s: selectors are immutable", d.Spec.Selector.MatchLabels, k)
		}
	}
	pods := map[string]corev1.PodSpec{"Deployment": d.Spec.Template.Spec}
	for _, step := range []string{"retire", "activate"} {
		c := cronJob(t, objs, step)
		hasCommon("CronJob "+c.Name+" Job template", c.Spec.JobTemplate.Labels)
		hasCommon("CronJob "+c.Name+" Pod template", c.Spec.JobTemplate.Spec.Template.Labels)
		if _, ok := c.Spec.JobTemplate.Spec.Template.Labels["example.com/tier"]; ok {
			t.Errorf("CronJob %s Pod labels %v: podLabels are meshca's Pods' alone", c.Name, c.Spec.JobTemplate.Spec.Template.Labels)
		}
		pods["CronJob "+c.Name] = c.Spec.JobTemplate.Spec.Template.Spec
	}
	for what, p := range pods {
		ctr := p.Containers[0]
		i := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "HTTPS_PROXY" })
		j := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "PROXY_TOKEN" })
		if i < 0 || ctr.Env[i].Value != "http://proxy.example:3128" || j < 0 || ctr.Env[j].ValueFrom == nil ||
			ctr.Env[j].ValueFrom.SecretKeyRef == nil || ctr.Env[j].ValueFrom.SecretKeyRef.Name != "proxy" {
			t.Errorf("%s env %+v: want extraEnv's HTTPS_PROXY and PROXY_TOKEN from the Secret proxy", what, ctr.Env)
		}
		if !slices.ContainsFunc(p.Volumes, func(v corev1.Volume) bool {
			return v.Name == "proxy-ca" && v.ConfigMap != nil && v.ConfigMap.Name == "proxy-ca"
		}) {
			t.Errorf("%s volumes %+v: want extraVolumes' proxy-ca", what, p.Volumes)
		}
		if !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "proxy-ca" && m.MountPath == "/etc/proxy-ca" && m.ReadOnly
		}) {
			t.Errorf("%s volume mounts %+v: want extraVolumeMounts' proxy-ca", what, ctr.VolumeMounts)
		}
	}
	// The chart's own mounts stay: istiod's certificate needs none, but
	// the default env does.
	if !slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "MEMORY_LIMIT" }) {
		t.Errorf("Deployment env %+v: extraEnv replaced the chart's MEMORY_LIMIT", d.Spec.Template.Spec.Containers[0].Env)
	}

	proxy := find(t, objs, "ConfigMap", "meshca-proxy-ca")
	if data, _, _ := unstructured.NestedStringMap(proxy.Object, "data"); data["trustDomain"] != "cluster.local" || proxy.GetNamespace() != ns {
		t.Errorf("extraObjects[0] %v: want tpl to fill the trust domain and namespace %s", proxy.Object, ns)
	}
	hasCommon("extraObjects[0]", proxy.GetLabels(), "cost-center")
	if proxy.GetLabels()["cost-center"] != "own" {
		t.Errorf("extraObjects[0] labels %v: its own cost-center must win over commonLabels'", proxy.GetLabels())
	}
	extra := find(t, objs, "ConfigMap", "meshca-extra")
	if data, _, _ := unstructured.NestedStringMap(extra.Object, "data"); data["replicas"] != "2" || extra.GetNamespace() != ns {
		t.Errorf("extraObjects[1] %v: want tpl to fill replicaCount and namespace %s in a map entry", extra.Object, ns)
	}

	apply(t, objs, false)
	kc, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	live := map[string]func() (metav1.Object, error){
		"CronJob meshca-root-activate": func() (metav1.Object, error) {
			return kc.BatchV1().CronJobs(ns).Get(ctx, "meshca-root-activate", metav1.GetOptions{})
		},
		"Secret meshca-ca-state": func() (metav1.Object, error) {
			return kc.CoreV1().Secrets(ns).Get(ctx, "meshca-ca-state", metav1.GetOptions{})
		},
		"ConfigMap meshca-extra": func() (metav1.Object, error) {
			return kc.CoreV1().ConfigMaps(ns).Get(ctx, "meshca-extra", metav1.GetOptions{})
		},
		"ClusterRoleBinding meshca": func() (metav1.Object, error) {
			return kc.RbacV1().ClusterRoleBindings().Get(ctx, "meshca", metav1.GetOptions{})
		},
	}
	for what, get := range live {
		o, err := get()
		if err != nil {
			t.Fatalf("%s after apply: %v", what, err)
		}
		hasCommon(what+" as the apiserver keeps it", o.GetLabels())
	}
}
