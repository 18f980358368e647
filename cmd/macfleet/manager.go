package main

import (
	goflag "flag"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/macfleet/macfleet/cmd/macfleet/manager"
	"github.com/macfleet/macfleet/controllers/autoscaler"
	"github.com/macfleet/macfleet/controllers/macnode"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/internal/modelsource"
)

func init() {
	root.AddCommand(newManagerCmd())
}

func newManagerCmd() *cobra.Command {
	var (
		cfg        manager.Config
		kubeconfig string
		zapOpts    = zap.Options{Development: false}
	)
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the control plane: deployments, scheduler, Mac liveness and endpoints",
		Long: `Run the macfleet controllers in one manager: the modeldeployment controller keeps
each ModelDeployment's replicas, the scheduler binds replicas to Macs with the memory
for them, the macnode controller watches each Mac's Lease, the endpoints controller
publishes a Service and EndpointSlices per deployment, and the autoscaler sizes
deployments with spec.autoscaling from the requests in flight on their agents.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			rc, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			cfg.RestConfig = rc
			return manager.Run(ctrl.SetupSignalHandler(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig; default: $KUBECONFIG, then in-cluster")
	f.StringVar(&cfg.MetricsAddr, "metrics-bind-address", ":8080", `Address of the Prometheus /metrics endpoint; "0" disables it`)
	f.StringVar(&cfg.ProbeAddr, "health-probe-bind-address", ":8081", `Address of /healthz and /readyz; "0" disables them`)
	f.BoolVar(&cfg.LeaderElection, "leader-elect", false, "Elect a leader so that only one manager replica acts at a time")
	f.StringVar(&cfg.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the manager's own)")
	f.DurationVar(&cfg.NodeLossGrace, "node-loss-grace", macnode.DefaultNodeLossGrace, "How long a Mac's Lease stays expired before its replicas move to other Macs")
	f.IntVar(&cfg.SchedulerWorkers, "scheduler-workers", scheduler.DefaultWorkers, "Bindings written in parallel")
	f.StringVar(&cfg.GatewayIdentity, "gateway-identity", "macfleet-gateway", "Name of the gateway identity (macfleet://gateway/<name>) whose client certificate "+
		"the manager issues and renews in Secret macfleet-system/macfleet-gateway-tls; \"\" issues none")
	f.StringVar(&cfg.MetricsIdentity, "metrics-identity", "macfleet-metrics", "Name of the identity (macfleet://metrics/<name>) with which Prometheus scrapes the agents' /metrics "+
		"(and may call nothing else on them); the manager issues and renews its client certificate in Secret macfleet-system/macfleet-metrics-tls; \"\" issues none")
	f.StringVar(&cfg.GatewayServingSecret, "gateway-serving-secret", "", "kubernetes.io/tls Secret of macfleet-system in which the manager keeps a serving certificate "+
		"from the fleet CA for --gateway-serving-hosts, renewed at two thirds of its life, for the gateway's own HTTPS listener (its clients trust ca.crt); \"\" issues none")
	f.StringSliceVar(&cfg.GatewayServingHosts, "gateway-serving-hosts", nil, "DNS names (a leading *. allowed) and IP addresses the gateway's serving certificate names, comma-separated")
	f.StringVar(&cfg.GatewayTunnel, "gateway-tunnel", "", "host:port of the gateway's --tunnel-listen: the agents of Macs that dial out "+
		"(macfleet agent --connect outbound) are read through it, the others at their addresses (default: every agent at its address)")
	f.DurationVar(&cfg.AutoscalerInterval, "autoscaler-interval", autoscaler.DefaultInterval, "How often the load of each autoscaled ModelDeployment is measured")
	f.StringVar(&cfg.NodeAuthorizerAddr, "node-authorizer-bind-address", "", `Address of the node authorizer webhook (HTTPS, path /authorize) the API server asks about node identities' reads of ModelReplicas; "" or "0" disables it`)
	f.StringVar(&cfg.NodeAuthorizerCertDir, "node-authorizer-cert-dir", "", "Directory with tls.crt and tls.key for the node authorizer webhook (reloaded when they change)")
	f.StringVar(&cfg.NodeAuthorizerClientCA, "node-authorizer-client-ca", "", "PEM file of the CAs that sign the API server's client certificate for the node authorizer webhook; callers without such a certificate are refused (unset: any caller that reaches the port is answered)")
	f.StringVar(&cfg.Resolver.HFEndpoint, "hf-endpoint", modelsource.DefaultHFEndpoint, "Model hub that hf:// sources resolve against")
	f.StringVar(&cfg.Resolver.OllamaRegistry, "ollama-registry", modelsource.DefaultOllamaRegistry, "Registry that ollama:// sources resolve against")
	gfs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	zapOpts.BindFlags(gfs)
	f.AddGoFlagSet(gfs)
	return cmd
}

// restConfig loads a kubeconfig from the flag, $KUBECONFIG or the in-cluster service
// account, in that order.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig, no $KUBECONFIG and not in a cluster: %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", path, err)
	}
	return rc, nil
}
