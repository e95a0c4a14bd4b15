package cluster_test

import "github.com/natgw/natgw/internal/clusterstack"

// The deployed controller's names and the gateway pods' namespace
// (internal/clusterstack).
const (
	controllerNS     = clusterstack.ControllerNS
	controllerSA     = clusterstack.ControllerSA
	controllerLease  = clusterstack.ControllerLease
	gatewayNamespace = clusterstack.GatewayNamespace
)
