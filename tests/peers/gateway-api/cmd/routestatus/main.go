// Command routestatus reads the HTTPRoutes and GRPCRoutes of one namespace with the upstream
// types and clientset of sigs.k8s.io/gateway-api (as Gateway API tooling and the conformance
// suite read them), and prints their status as one JSON object:
// "KIND/NAME" → [{controllerName, parent, port, conditions: {TYPE: "STATUS REASON"},
// observedGeneration}], plus "generation/KIND/NAME" → metadata.generation.
//
// Usage:
//
//	routestatus -kubeconfig FILE -namespace NS
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)

type parent struct {
	ControllerName     string            `json:"controllerName"`
	Parent             string            `json:"parent"`
	Port               int32             `json:"port"`
	Conditions         map[string]string `json:"conditions"`
	ObservedGeneration map[string]int64  `json:"observedGeneration"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the hub's kubeconfig")
	namespace := flag.String("namespace", "", "the namespace of the routes")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	client, err := versioned.NewForConfig(config)
	if err != nil {
		fail("client: %v", err)
	}
	ctx := context.Background()
	out := map[string]any{}
	http, err := client.GatewayV1().HTTPRoutes(*namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list HTTPRoutes: %v", err)
	}
	for _, r := range http.Items {
		out["HTTPRoute/"+r.Name] = describe(r.Status.Parents)
		out["generation/HTTPRoute/"+r.Name] = r.Generation
	}
	grpc, err := client.GatewayV1().GRPCRoutes(*namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		fail("list GRPCRoutes: %v", err)
	}
	for _, r := range grpc.Items {
		out["GRPCRoute/"+r.Name] = describe(r.Status.Parents)
		out["generation/GRPCRoute/"+r.Name] = r.Generation
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("encode: %v", err)
	}
}

func describe(parents []gatewayv1.RouteParentStatus) []parent {
	described := []parent{}
	for _, p := range parents {
		d := parent{
			ControllerName:     string(p.ControllerName),
			Parent:             string(p.ParentRef.Name),
			Conditions:         map[string]string{},
			ObservedGeneration: map[string]int64{},
		}
		if p.ParentRef.Kind != nil {
			d.Parent = string(*p.ParentRef.Kind) + "/" + d.Parent
		}
		if p.ParentRef.Port != nil {
			d.Port = int32(*p.ParentRef.Port)
		}
		for _, c := range p.Conditions {
			d.Conditions[c.Type] = string(c.Status) + " " + c.Reason
			d.ObservedGeneration[c.Type] = c.ObservedGeneration
		}
		described = append(described, d)
	}
	return described
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "routestatus: "+format+"\n", args...)
	os.Exit(1)
}
