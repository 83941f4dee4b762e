// Command clusterprofiles reads the ClusterProfiles of one namespace with the upstream types
// and clientset of sigs.k8s.io/cluster-inventory-api (as Argo CD, MultiKueue and
// multicluster-runtime consumers read them), and prints them as one JSON object: name →
// {clusterManager, labels, conditions, version, properties, accessProviders}.
//
// Usage:
//
//	clusterprofiles -kubeconfig FILE -namespace NS
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/cluster-inventory-api/client/clientset/versioned"
)

type profile struct {
	ClusterManager  string                    `json:"clusterManager"`
	Labels          map[string]string         `json:"labels"`
	Conditions      map[string]string         `json:"conditions"`
	Reasons         map[string]string         `json:"reasons"`
	Version         string                    `json:"version"`
	Properties      map[string]string         `json:"properties"`
	AccessProviders map[string]accessProvider `json:"accessProviders"`
}

type accessProvider struct {
	Server string `json:"server"`
	CA     bool   `json:"certificateAuthorityData"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the hub's kubeconfig")
	namespace := flag.String("namespace", "", "the namespace of the ClusterProfiles")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	client, err := versioned.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	list, err := client.ApisV1alpha1().ClusterProfiles(*namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		fail("list ClusterProfiles: %v", err)
	}
	out := map[string]profile{}
	for _, cp := range list.Items {
		out[cp.Name] = describe(cp)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("encode: %v", err)
	}
}

func describe(cp v1alpha1.ClusterProfile) profile {
	p := profile{
		ClusterManager:  cp.Spec.ClusterManager.Name,
		Labels:          cp.Labels,
		Conditions:      map[string]string{},
		Reasons:         map[string]string{},
		Version:         cp.Status.Version.Kubernetes,
		Properties:      map[string]string{},
		AccessProviders: map[string]accessProvider{},
	}
	for _, c := range cp.Status.Conditions {
		p.Conditions[c.Type] = string(c.Status)
		p.Reasons[c.Type] = c.Reason
	}
	for _, prop := range cp.Status.Properties {
		p.Properties[prop.Name] = prop.Value
	}
	for _, a := range cp.Status.AccessProviders {
		p.AccessProviders[a.Name] = accessProvider{Server: a.Cluster.Server, CA: len(a.Cluster.CertificateAuthorityData) > 0}
	}
	return p
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "clusterprofiles: "+format+"\n", args...)
	os.Exit(1)
}
