package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/macfleet/macfleet/internal/credentials"
)

func init() {
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Manage the Macs of the fleet",
	}
	nodes.AddCommand(nodesCredentialsCmd())
	root.AddCommand(nodes)
}

func nodesCredentialsCmd() *cobra.Command {
	var (
		kubeconfig, kubeContext string
		opts                    credentials.Options
		output                  string
	)
	cmd := &cobra.Command{
		Use:   "credentials <name>",
		Short: "Create a Mac's node identity and print a kubeconfig for its agent",
		Long: `Creates the ServiceAccount <name> in macfleet-nodes (the identity of the Mac whose
MacNode is <name>), makes sure the fleet token Secret exists in macfleet-system, and
prints a kubeconfig that authenticates as that identity with a token from the
TokenRequest API. RBAC from the chart (or config/agent) lets the identity run an agent;
the admission policy (config/admission) confines it to its own MacNode, its own Lease
and the status of the replicas bound to it.

The token lasts --duration unless the API server caps it
(--service-account-max-token-expiration); the expiry is printed on stderr. Running the
command again issues a new token; earlier ones stay valid until they expire or the
ServiceAccount is deleted.`,
		Example: `  macfleet nodes credentials mac-studio-1 --server https://k8s.example.com:6443 -o mac-studio-1.kubeconfig`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := credentials.ValidateNodeName(name); err != nil {
				return err
			}
			rc, err := adminRestConfig(kubeconfig, kubeContext)
			if err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return fmt.Errorf("building a client: %w", err)
			}
			cred, err := credentials.Issue(cmd.Context(), cs, rc, name, opts)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			for _, w := range cred.Warnings {
				fmt.Fprintln(stderr, "Warning:", w)
			}
			if output == "" {
				_, err := cmd.OutOrStdout().Write(cred.Kubeconfig)
				return err
			}
			if err := credentials.WriteFile(output, cred.Kubeconfig); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "Wrote the kubeconfig of node %s to %s (mode 0600); its token expires %s\n",
				name, output, cred.Expires.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "Administrator kubeconfig; default: $KUBECONFIG, then ~/.kube/config, then in-cluster")
	f.StringVar(&kubeContext, "context", "", "Context of the administrator kubeconfig to use")
	f.StringVar(&opts.Server, "server", "", "API server URL the Mac uses (default: the administrator kubeconfig's)")
	f.DurationVar(&opts.Duration, "duration", credentials.DefaultDuration, "Token lifetime to ask for (the API server may cap it; at least 10m)")
	f.StringVarP(&output, "output", "o", "", "Write the kubeconfig to this file (mode 0600) instead of stdout")
	return cmd
}

// adminRestConfig loads the operator's kubeconfig the way kubectl does: the flag,
// $KUBECONFIG, ~/.kube/config, then the in-cluster service account.
func adminRestConfig(path, kubeContext string) (*rest.Config, error) {
	rc, err := kubeconfig(path, kubeContext).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the administrator kubeconfig: %w", err)
	}
	return rc, nil
}

// kubeconfig is the kubeconfig found the way kubectl finds it (path, else $KUBECONFIG,
// else ~/.kube/config, else in-cluster), at kubeContext or its current context.
func kubeconfig(path, kubeContext string) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubeContext})
}
