// Command coredns is CoreDNS, the cluster DNS of Kubernetes, with the plugins the local
// cluster's DNS uses compiled in: the way CoreDNS documents building it with a chosen set of
// plugins ("a main package that imports coremain and the plugins", coredns.io, "Compile Time
// Enabling or Disabling Plugins"). The kubernetes plugin answers <service>.<namespace>.svc and
// <hostname>.<subdomain>.<namespace>.svc names from the API server, as a cluster's DNS does
// (https://kubernetes.io/docs/concepts/services-networking/dns-pod-service/).
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
