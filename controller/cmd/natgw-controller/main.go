// Command natgw-controller reconciles the kubeovn.io/v1 NAT CRDs
// (IptablesEIP, IptablesFIPRule, IptablesDnatRule, IptablesSnatRule,
// VpcNatGateway) onto natgw gateways, finalizer first, through one
// long-lived `natgw serve` session per gateway (pod exec in a cluster, or a
// child process in a network namespace with --transport=local).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/natgw/natgw/controller/admission"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/companion"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/provision"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natgw-controller:", err)
		os.Exit(1)
	}
}

type flags struct {
	mode             string
	companionPeriod  time.Duration
	companionGrace   time.Duration
	kubeconfig       string
	workers          int
	sweepPeriod      time.Duration
	driftPeriod      time.Duration
	dataplane        nat.DataplaneName
	dataplaneArg     string // --dataplane as given; parsed into dataplane
	transport        string
	natgwBinary      string
	gatewayConfig    string
	podNamespace     string
	gatewayNS        []string
	metricsAddr      string
	probeAddr        string
	leaderElect      bool
	leaderElectionNS string
	leaseDuration    time.Duration
	renewDeadline    time.Duration
	retryPeriod      time.Duration
	removeUpstream   bool
	ruleLabels       bool
	verbosity        int
	logJSON          bool
	provision        bool
	haGateways       bool
	haLease          time.Duration
	gatewayImage     string
	serviceCIDR      string
	networkSource    string
	webhookPort      int
	webhookCertDir   string
	pprof            bool
	syncParallel     int
	memoryLimit      string
	watchList        bool
}

func parseFlags(fs *flag.FlagSet, args []string) (*flags, error) {
	f := &flags{}
	fs.StringVar(&f.mode, "mode", modeReplace, "replace: natgw-controller programs the NAT CRs onto the gateways itself (Kube-OVN's VPC NAT gateway feature must be off); companion: Kube-OVN's controller programs them through the natgw image's nat-gateway.sh and natgw-controller only removes the compat objects Kube-OVN <= v1.13.8 leaks (see controller/README.md)")
	fs.DurationVar(&f.companionPeriod, "companion-period", companion.DefaultPeriod, "companion mode: period of the leak sweep over every gateway")
	fs.DurationVar(&f.companionGrace, "companion-grace", companion.DefaultGrace, "companion mode: an unclaimed compat object is removed only once seen unclaimed and unchanged in two sweeps at least this far apart")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config)")
	fs.IntVar(&f.workers, "workers", reconciler.DefaultWorkers, "parallel reconciles per kind (per-gateway ordering comes from the agent)")
	fs.IntVar(&f.syncParallel, "gateway-sync-parallel", gateway.DefaultSyncParallel(), "gateways that connect (open their agent session and sync their desired set) at once; the others wait their turn, as at a cold start where every gateway syncs")
	fs.DurationVar(&f.sweepPeriod, "sweep-period", 5*time.Minute, "period of the orphan sweep on every gateway (also runs on each (re)connect); 0 disables the periodic sweep")
	fs.DurationVar(&f.driftPeriod, "drift-period", 10*time.Minute, "period of the drift check (fresh list compared to the desired set, repaired with sync); 0 disables it")
	fs.StringVar(&f.dataplaneArg, "dataplane", string(nat.DataplaneNftables), "data plane of every gateway's agent: nftables or iptables (per gateway: annotation "+reconciler.DataplaneAnnotation+" on the VpcNatGateway)")
	fs.StringVar(&f.transport, "transport", "exec", "how to reach gateways: exec (pod exec into the gateway pod) or local (natgw serve in a network namespace on this host)")
	fs.StringVar(&f.natgwBinary, "natgw-binary", "natgw", "path of the natgw binary (local transport), or its name inside the gateway container (exec transport)")
	fs.StringVar(&f.gatewayConfig, "gateway-config", "", "YAML file mapping gateways to namespaces and external network settings (required for the local transport)")
	fs.StringVar(&f.podNamespace, "pod-namespace", "kube-system", "namespace of the gateway pods (exec transport) of a VpcNatGateway without spec.namespace")
	fs.Func("gateway-namespaces", "comma-separated other namespaces a VpcNatGateway's spec.namespace may name (--provision-gateways: the provisioner watches and writes StatefulSets there; natgw-controller's RBAC must grant them, see controller/docs/operations.md)", func(v string) error {
		for _, ns := range strings.Split(v, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
					return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
				}
				f.gatewayNS = append(f.gatewayNS, ns)
			}
		}
		return nil
	})
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (0 disables it)")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of the /healthz and /readyz endpoints")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "elect a leader so that only one replica programs gateways")
	fs.StringVar(&f.leaderElectionNS, "leader-election-namespace", "", "namespace of the leader election lease (default: the pod's namespace)")
	fs.DurationVar(&f.leaseDuration, "leader-elect-lease-duration", DefaultLeaseDuration, "how long a standby replica waits after the leader's last renewal before it takes the lease (a clean stop gives the lease back at once; this is the wait after a crash)")
	fs.DurationVar(&f.renewDeadline, "leader-elect-renew-deadline", DefaultRenewDeadline, "how long the leader keeps trying to renew its lease before it gives up leading and exits: the longest kube-apiserver outage (a restart, an upgrade) the leader survives with its caches and gateway sessions; must be below --leader-elect-lease-duration")
	fs.DurationVar(&f.retryPeriod, "leader-elect-retry-period", DefaultRetryPeriod, "how often the leader renews its lease and a standby tries to take it")
	fs.BoolVar(&f.removeUpstream, "remove-upstream-finalizer", true, "also remove Kube-OVN's "+v1.Finalizer+" finalizer when natgw completes a deletion (natgw replaces kube-ovn-controller's VPC NAT gateway handling)")
	fs.BoolVar(&f.ruleLabels, "rule-labels", false, "also write upstream's labels "+v1.LabelEIPV4IP+" and "+v1.LabelVpcNatGwName+" on NAT rules (the latter on IptablesEIPs) before programming, as kube-ovn-controller does; natgw does not need them (one more API write per object)")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity (0: changes and failures, 1: every object programmed, 2+: debug)")
	fs.BoolVar(&f.logJSON, "log-json", true, "structured JSON logs (false: text)")
	fs.BoolVar(&f.provision, "provision-gateways", false, "replace mode: create each VpcNatGateway's gateway StatefulSet in Kube-OVN's shape (vpc-nat-gw-<name> in --pod-namespace) with --gateway-image, keep it in step with the spec and write the gateway's status as Kube-OVN does (controller/provision); Kube-OVN's VPC NAT gateway feature must be off")
	fs.BoolVar(&f.haGateways, "ha-gateways", false, "with --provision-gateways: provision a VpcNatGateway that asks for 2 replicas (spec.replicas, or annotation "+provision.ReplicasAnnotation+") as two pods with pod anti-affinity and the ServiceAccount "+provision.GatewayServiceAccount+" (apply controller/config/ha for its Lease); each pod runs `natgw ha` (container natgw-ha) and the exec transport programs both (`serve --rules-only`); experimental: the lanIp's Kube-OVN Vip/aaps is not made yet. Off: such a gateway gets one pod and a Warning event")
	fs.DurationVar(&f.haLease, "ha-lease", 0, "with --ha-gateways: the fence lease of two-replica gateways (natgw ha --lease; 0: its default, 250 ms). The active steps down when its Lease renewals keep failing for the lease minus two heartbeats, the standby takes over after a kill once it ran out: a slow API server needs more (1s in the cluster lab under load), at the cost of a gap that long after a kill")
	fs.StringVar(&f.gatewayImage, "gateway-image", "", "with --provision-gateways: natgw's gateway image (Kube-OVN's vpcNatImage)")
	fs.StringVar(&f.serviceCIDR, "service-cluster-ip-range", "10.96.0.0/12", "with --provision-gateways: the cluster's service CIDR, routed via the VPC subnet's gateway as Kube-OVN does (kube-ovn-controller's flag of the same name)")
	fs.StringVar(&f.networkSource, "network-source", "", "replace mode: where gateways' networks come from: "+networkKubeOVN+" (Kube-OVN's Subnets: each EIP's prefix length from its external subnet, each gateway's default route via its external subnet's gateway and routes to its VPC's other subnets, as Kube-OVN does) or "+networkConfig+" (--gateway-config's externalPrefixLen and externalGateway, no VPC routes); default "+networkKubeOVN+" with --provision-gateways, else "+networkConfig)
	fs.IntVar(&f.webhookPort, "webhook-port", 0, "replace mode: serve the validating admission webhook (controller/admission: Kube-OVN's webhook checks of the NAT CRs, which Kube-OVN stops making with its feature off) on this port; 0 disables it. Deploy controller/config/webhook with it")
	fs.StringVar(&f.webhookCertDir, "webhook-cert-dir", "", "with --webhook-port: directory of the serving certificate (tls.crt, tls.key); default controller-runtime's, $TMPDIR/k8s-webhook-server/serving-certs")
	fs.StringVar(&f.memoryLimit, "memory-limit", memoryLimitAuto, "the Go runtime's soft memory limit (debug.SetMemoryLimit): a quantity such as 400Mi; off (or 0) for none; auto: GOMEMLIMIT when set, else 90% of the container's cgroup memory limit when it has one. Under it the garbage collector runs more often instead of letting the heap grow to twice what is live (GOGC=100), which is most of the resident memory at a cold start")
	fs.BoolVar(&f.watchList, "watch-list-client", true, "informers' initial lists as watch streams, one event per object (client-go's WatchListClient gate and default); false: one LIST per kind, which at 113k objects halves the controller's and kube-apiserver's CPU and the time until the caches synced, for a resident peak 45-135 MiB higher at the start (bench/README.md, \"Scenario 6: the cold start's list\"; controller/docs/operations.md, Memory); $"+watchListEnv+", when set, wins")
	fs.BoolVar(&f.pprof, "pprof", false, "serve Go's runtime profiles (net/http/pprof) under /debug/pprof/ on the metrics endpoint (needs --metrics-bind-address)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if _, _, err := memoryLimit(f.memoryLimit, func(string) string { return "" }); err != nil {
		return nil, err
	}
	if err := checkLeaderElection(f.leaseDuration, f.renewDeadline, f.retryPeriod); err != nil {
		return nil, err
	}
	if f.pprof && f.metricsAddr == "0" {
		return nil, errors.New("--pprof needs --metrics-bind-address (the profiles are served there)")
	}
	if f.networkSource == "" {
		f.networkSource = networkConfig
		if f.provision {
			f.networkSource = networkKubeOVN
		}
	}
	switch f.networkSource {
	case networkConfig:
	case networkKubeOVN:
		if f.mode != modeReplace {
			return nil, fmt.Errorf("--network-source=%s needs --mode=%s (companion mode programs nothing)", networkKubeOVN, modeReplace)
		}
	default:
		return nil, fmt.Errorf("--network-source: %q is not %s or %s", f.networkSource, networkKubeOVN, networkConfig)
	}
	dp, err := nat.ParseDataplaneName("--dataplane", f.dataplaneArg)
	if err != nil {
		return nil, err
	}
	f.dataplane = dp
	switch f.mode {
	case modeReplace:
	case modeCompanion:
		if f.dataplane != nat.DataplaneNftables {
			return nil, fmt.Errorf("--dataplane=%s: --mode=companion reads gateways on the nftables data plane, the one the image's nat-gateway.sh programs", f.dataplane)
		}
		if f.companionPeriod <= 0 || f.companionGrace <= 0 {
			return nil, fmt.Errorf("--companion-period=%v, --companion-grace=%v: both must be positive", f.companionPeriod, f.companionGrace)
		}
	default:
		return nil, fmt.Errorf("--mode: %q is not %s or %s", f.mode, modeReplace, modeCompanion)
	}
	switch f.transport {
	case "exec", "local":
	default:
		return nil, fmt.Errorf("--transport: %q is not exec or local", f.transport)
	}
	if f.transport == "local" && f.gatewayConfig == "" {
		return nil, errors.New("--transport=local needs --gateway-config (which namespace is which gateway)")
	}
	if f.provision {
		switch {
		case f.mode != modeReplace:
			return nil, fmt.Errorf("--provision-gateways needs --mode=%s", modeReplace)
		case f.transport != "exec":
			return nil, errors.New("--provision-gateways needs --transport=exec (the gateways are pods)")
		case f.gatewayImage == "":
			return nil, errors.New("--provision-gateways needs --gateway-image")
		}
	}
	if f.haLease != 0 && !f.haGateways {
		return nil, errors.New("--ha-lease needs --ha-gateways")
	}
	if f.haLease < 0 || (f.haLease > 0 && f.haLease <= provision.MinHALease) {
		return nil, fmt.Errorf("--ha-lease %s: want 0 (natgw ha's default, 250 ms) or more than %s", f.haLease, provision.MinHALease)
	}
	if f.haGateways && !f.provision {
		return nil, errors.New("--ha-gateways needs --provision-gateways (it says how gateways are provisioned)")
	}
	if f.webhookPort != 0 && f.mode != modeReplace {
		return nil, fmt.Errorf("--webhook-port needs --mode=%s (in companion mode Kube-OVN's own webhook checks the NAT CRs)", modeReplace)
	}
	if f.webhookPort < 0 || f.webhookPort > 65535 {
		return nil, fmt.Errorf("--webhook-port: %d is not a port", f.webhookPort)
	}
	if f.syncParallel < 1 {
		return nil, fmt.Errorf("--gateway-sync-parallel: %d, want at least 1", f.syncParallel)
	}
	if f.workers < 1 {
		return nil, fmt.Errorf("--workers: %d, want at least 1", f.workers)
	}
	return f, nil
}

// The two modes of --mode (controller/README.md: replace and companion).
const (
	// modeReplace: natgw-controller programs the NAT CRs itself.
	modeReplace = "replace"
	// modeCompanion: Kube-OVN's controller programs them; natgw-controller
	// only removes leaked compat objects (controller/companion).
	modeCompanion = "companion"
)

// The two values of --network-source.
const (
	networkKubeOVN = "kube-ovn"
	networkConfig  = "config"
)

// Leader election timings. controller-runtime's defaults (15 s, 10 s, 2 s)
// make the leader give up when kube-apiserver is away for more than 10 s,
// which a restart of it often is: the process exits, and its successor
// lists every object again and reconnects every gateway. These survive an
// outage of up to 40 s, at the price of a standby waiting up to 60 s after
// the leader crashed (a clean stop hands the lease over at once). The
// lease outlasts the renew deadline by 20 s, so a leader cut off from the
// API server has stopped leading before anyone else may start.
const (
	DefaultLeaseDuration = 60 * time.Second
	DefaultRenewDeadline = 40 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// checkLeaderElection validates the leader election timings as client-go's
// leader elector does, naming the flags.
func checkLeaderElection(lease, renew, retry time.Duration) error {
	switch {
	case retry <= 0:
		return fmt.Errorf("--leader-elect-retry-period %s: want > 0", retry)
	case float64(renew) <= 1.2*float64(retry):
		return fmt.Errorf("--leader-elect-renew-deadline %s: want more than 1.2 × --leader-elect-retry-period (%s)", renew, retry)
	case lease <= renew:
		return fmt.Errorf("--leader-elect-lease-duration %s: want more than --leader-elect-renew-deadline (%s)", lease, renew)
	}
	return nil
}

// gracefulShutdown bounds how long a stopping controller waits for its
// gateway managers (sessions closing) before it releases the lease anyway.
var gracefulShutdown = 20 * time.Second

func run() error {
	f, err := parseFlags(flag.NewFlagSet("natgw-controller", flag.ExitOnError), os.Args[1:])
	if err != nil {
		return err
	}
	hopts := &slog.HandlerOptions{Level: slog.Level(-f.verbosity)}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, hopts)
	if f.logJSON {
		h = slog.NewJSONHandler(os.Stderr, hopts)
	}
	ctrl.SetLogger(logr.FromSlogHandler(h))
	log := ctrl.Log.WithName("natgw-controller")
	memLimit, memSource, err := applyMemoryLimit(f.memoryLimit)
	if err != nil {
		return err
	}
	log.Info("memory limit", "bytes", memLimit, "from", memSource)
	watchList, err := applyWatchList(f.watchList, os.Getenv)
	if err != nil {
		return err
	}
	log.Info("informers' initial lists", "watchListClient", watchList)

	cfg := &gwconfig.Config{}
	if f.gatewayConfig != "" {
		if cfg, err = gwconfig.Load(f.gatewayConfig); err != nil {
			return err
		}
	}
	restCfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}

	scheme, err := v1.NewScheme()
	if err != nil {
		return err
	}
	cacheOpts := cacheOptions(f)
	var hooks webhook.Server
	if f.webhookPort != 0 {
		hooks = webhook.NewServer(webhook.Options{Port: f.webhookPort, CertDir: f.webhookCertDir})
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		WebhookServer:           hooks,
		Cache:                   cacheOpts,
		Metrics:                 metricsOptions(f),
		HealthProbeBindAddress:  f.probeAddr,
		LeaderElection:          f.leaderElect,
		LeaderElectionID:        "natgw-controller.kubeovn.io",
		LeaderElectionNamespace: f.leaderElectionNS,
		// A clean stop (SIGTERM) gives the lease back once every runnable
		// (the gateway managers) has stopped, so the next replica takes
		// over at once instead of waiting for the lease to expire. Safe:
		// the process exits right after mgr.Start returns.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &f.leaseDuration,
		RenewDeadline:                 &f.renewDeadline,
		RetryPeriod:                   &f.retryPeriod,
		GracefulShutdownTimeout:       &gracefulShutdown,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}

	var tr transport.Transport
	// apiReady probes the path of exec sessions (nil: local transport).
	var apiReady func(context.Context) error
	switch f.transport {
	case "local":
		tr = &transport.Local{Binary: f.natgwBinary, Log: log.WithName("agent")}
	case "exec":
		cs, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return fmt.Errorf("clientset: %w", err)
		}
		tr = &transport.Exec{Config: restCfg, Client: cs, Namespace: f.podNamespace, NamespaceOf: gatewayNamespaceOf(mgr.GetCache(), f.podNamespace), Command: f.natgwBinary, Log: log.WithName("agent")}
		cfg.Unlisted = true // any gateway's pod is found by its label
		// Every exec session breaks when kube-apiserver restarts: the
		// managers reconnect as soon as it answers /readyz again.
		apiReady = func(ctx context.Context) error {
			if err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
				return fmt.Errorf("kube-apiserver /readyz: %w", err)
			}
			return nil
		}
	}

	ctx := ctrl.SetupSignalHandler()
	if f.mode == modeCompanion {
		if _, err := companion.Setup(mgr, companion.Options{
			Transport: tr, Config: cfg, Period: f.companionPeriod, Grace: f.companionGrace,
			Log: log.WithName("companion"),
		}); err != nil {
			return err
		}
		log.Info("starting", "mode", f.mode, "transport", f.transport, "period", f.companionPeriod, "grace", f.companionGrace, "leaderElection", f.leaderElect)
		return mgr.Start(ctx)
	}
	_, err = reconciler.Setup(ctx, mgr, reconciler.Config{
		Workers:                 f.workers,
		RemoveUpstreamFinalizer: f.removeUpstream,
		RuleLabels:              f.ruleLabels,
		KubeOVNNetwork:          f.networkSource == networkKubeOVN,
		Gateway: gateway.Options{
			Transport:        tr,
			Config:           cfg,
			DefaultDataplane: f.dataplane,
			SweepPeriod:      f.sweepPeriod,
			SyncParallel:     f.syncParallel,
			DriftPeriod:      f.driftPeriod,
			Probe:            apiReady,
			Log:              log.WithName("gateway"),
		},
	})
	if err != nil {
		return err
	}
	if hooks != nil {
		// Every replica serves it (the Service balances over them); it
		// reads the manager's cache with the indexes Setup registered.
		admission.New(mgr.GetCache(), scheme, f.networkSource == networkKubeOVN).Register(hooks)
		if err := mgr.AddReadyzCheck("webhook", hooks.StartedChecker()); err != nil {
			return err
		}
	}
	if f.provision {
		var standbyLag func(string) time.Duration
		if ex, ok := tr.(*transport.Exec); ok && f.haGateways {
			standbyLag = ex.StandbyLag
		}
		if _, err := provision.Setup(mgr, provision.Options{
			Namespace: f.podNamespace, GatewayNamespaces: f.gatewayNS, Image: f.gatewayImage, ServiceClusterIPRange: f.serviceCIDR,
			HA: f.haGateways, HALease: f.haLease, StandbyLag: standbyLag, Workers: f.workers, Log: log.WithName("provision"),
		}); err != nil {
			return err
		}
	}
	log.Info("starting", "mode", f.mode, "provisionGateways", f.provision, "haGateways", f.haGateways, "networkSource", f.networkSource, "transport", f.transport, "dataplane", f.dataplane, "workers", f.workers, "leaderElection", f.leaderElect, "ruleLabels", f.ruleLabels, "webhookPort", f.webhookPort)
	return mgr.Start(ctx)
}

// gatewayNamespaceOf is the exec transport's Exec.NamespaceOf: the
// namespace of the VpcNatGateway's workload (provision.GatewayNamespace),
// read from the manager's cache; a gateway that is gone is looked for in
// the configured namespace.
func gatewayNamespaceOf(r client.Reader, configured string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, name string) (string, error) {
		g := &v1.VpcNatGateway{}
		if err := r.Get(ctx, types.NamespacedName{Name: name}, g); err != nil {
			if apierrors.IsNotFound(err) {
				return configured, nil
			}
			return "", fmt.Errorf("get VpcNatGateway %s: %w", name, err)
		}
		return provision.GatewayNamespace(g, configured), nil
	}
}

// restConfig loads --kubeconfig, or what ctrl.GetConfig finds (in-cluster
// config, $KUBECONFIG, ~/.kube/config). Either way client-side rate
// limiting is off unless the file sets a QPS, as ctrl.GetConfig has it: the
// API server's priority and fairness limits the controller, not client-go's
// default of 5 requests per second, which would hold a burst of FIPs to a
// couple per second.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return ctrl.GetConfig()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// cacheOptions is the informer cache's configuration. natgw never reads
// managedFields or kubectl's last-applied-configuration annotation (a
// second copy of an object applied with `kubectl apply`), and never sends
// a cached object back whole (it writes by merge patches computed from the
// fields it changes and by server-side apply of objects it builds), so
// every cached object is stored without them (stripCache).
func cacheOptions(f *flags) cache.Options {
	o := cache.Options{DefaultTransform: stripCache}
	if f.provision {
		o.ByObject = provision.CacheByObject(f.podNamespace, f.gatewayNS, f.haGateways)
	}
	return o
}

// metricsOptions is the metrics endpoint, with Go's runtime profiles under
// /debug/pprof/ when --pprof is set (bench scenario 6 reads the heap there).
func metricsOptions(f *flags) metricsserver.Options {
	o := metricsserver.Options{BindAddress: f.metricsAddr}
	if f.pprof {
		o.ExtraHandlers = map[string]http.Handler{
			"/debug/pprof/":        http.HandlerFunc(pprof.Index),
			"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
			"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
			"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
			"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
		}
	}
	return o
}
