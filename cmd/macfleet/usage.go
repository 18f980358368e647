package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/gateway/metering/report"
	"github.com/macfleet/macfleet/internal/kubescheme"
)

func init() { root.AddCommand(usageCmd()) }

func usageCmd() *cobra.Command {
	var (
		path, kubeContext string
		cfg               report.Config
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Print the tokens and requests the gateways counted, per day and per key",
		Long: `Reads the gateways' ledger (the TokenUsage objects each gateway replica keeps per
namespace and UTC day) with your kubeconfig, adds the replicas' counts up and prints
them per day and per key, or per key and deployment with --by-deployment.

It lists TokenUsages in one namespace (-n, default the kubeconfig context's), so RBAC
to list tokenusages in that namespace is enough; -A reads every namespace.`,
		Example: `  macfleet usage -n team-a --days 7
  macfleet usage -n team-a --since 2026-11-01 --by-deployment -o csv > team-a.csv
  macfleet usage -A --days 1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cc := kubeconfig(path, kubeContext)
			rc, err := cc.ClientConfig()
			if err != nil {
				return fmt.Errorf("loading the kubeconfig: %w", err)
			}
			if cfg.Namespace == "" && !cfg.AllNamespaces {
				if cfg.Namespace, _, err = cc.Namespace(); err != nil {
					return fmt.Errorf("the kubeconfig context's namespace: %w", err)
				}
			}
			scheme, err := kubescheme.New()
			if err != nil {
				return err
			}
			c, err := client.New(rc, client.Options{Scheme: scheme})
			if err != nil {
				return fmt.Errorf("building a client: %w", err)
			}
			cfg.Now = time.Now()
			return report.Run(cmd.Context(), c, cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "kubeconfig", "", "Kubeconfig; default: $KUBECONFIG, then ~/.kube/config, then in-cluster")
	f.StringVar(&kubeContext, "context", "", "Context of the kubeconfig to use")
	f.StringVarP(&cfg.Namespace, "namespace", "n", "", "Namespace whose usage to read (default: the kubeconfig context's)")
	f.BoolVarP(&cfg.AllNamespaces, "all-namespaces", "A", false, "Read every namespace's usage")
	f.IntVar(&cfg.Days, "days", 7, "Days to print, counting back from today (UTC), today included")
	f.StringVar(&cfg.Since, "since", "", "First UTC day to print (YYYY-MM-DD), instead of --days")
	f.BoolVar(&cfg.ByDeployment, "by-deployment", false, "A row per key and deployment instead of per key")
	f.StringVarP(&cfg.Output, "output", "o", report.Table, "Output format: table or csv")
	return cmd
}
