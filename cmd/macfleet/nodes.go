package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/nodeauthz"
)

func init() {
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Manage the Macs of the fleet",
	}
	nodes.AddCommand(nodesCredentialsCmd(), nodesRevokeCmd())
	root.AddCommand(nodes)
}

// credentialsOptions are the flags of `macfleet nodes credentials`.
type credentialsOptions struct {
	kubeconfig, kubeContext string
	opts                    credentials.Options
	output, ceiling         string
}

func nodesCredentialsCmd() *cobra.Command {
	var o credentialsOptions
	cmd := &cobra.Command{
		Use:   "credentials <name>",
		Short: "Create a Mac's node identity and print a kubeconfig for its agent",
		Long: `Creates the ServiceAccount <name> in macfleet-nodes (the identity of the Mac whose
MacNode is <name>) and prints a kubeconfig that authenticates as that identity with a token from the
TokenRequest API. RBAC from the chart (or config/agent) lets the identity run an agent;
the admission policy (config/admission) confines it to its own MacNode, its own Lease
and the status of the replicas bound to it.

The token lasts --duration (at most 48h) unless the API server caps it
(--service-account-max-token-expiration); the expiry is printed on stderr. The running
agent renews its token before it expires and rewrites the kubeconfig file, so only a
Mac whose agent stays down longer than that needs a new credential. Every token is
bound to the Secret macfleet-nodes/<name>-credential: "macfleet nodes revoke <name>"
revokes all of them at once. Running this command again issues another token; earlier
ones stay valid until they expire or are revoked.

The first TLS certificate the agent gets pins its key to the Mac: later certificates
are issued only for that key or for a new one it vouches for, so a copy of the token
gets none. Running this command again clears the pin (it says so), for a Mac that lost
its key; if the token may have been copied, run "macfleet nodes revoke <name>" first.

--memory-ceiling sets the operator's bound on the Mac (its MacNode's
spec.memoryCeiling, created now if the agent has not registered yet): the scheduler
never believes the Mac has more memory than that, whatever its agent reports.`,
		Example: `  macfleet nodes credentials mac-studio-1 --server https://k8s.example.com:6443 --memory-ceiling 180Gi -o mac-studio-1.kubeconfig`,
		Args:    cobra.ExactArgs(1),
		RunE:    func(cmd *cobra.Command, args []string) error { return runNodesCredentials(cmd, args[0], &o) },
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds the flags of nodes credentials to o.
func (o *credentialsOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "Administrator kubeconfig; default: $KUBECONFIG, then ~/.kube/config, then in-cluster")
	f.StringVar(&o.kubeContext, "context", "", "Context of the administrator kubeconfig to use")
	f.StringVar(&o.opts.Server, "server", "", "API server URL the Mac uses (default: the administrator kubeconfig's, unless it is a loopback address such as k3s's https://127.0.0.1:6443)")
	f.DurationVar(&o.opts.Duration, "duration", credentials.DefaultDuration, "Token lifetime to ask for (the API server may cap it; 10m to 48h)")
	f.StringVar(&o.ceiling, "memory-ceiling", "", "The most memory the scheduler believes this Mac has, e.g. 180Gi (its MacNode's spec.memoryCeiling; "+
		"default: the agent's report, capped by its chip's largest memory)")
	f.StringVarP(&o.output, "output", "o", "", "Write the kubeconfig to this file (mode 0600) instead of stdout")
}

// runNodesCredentials issues node name's credential, says on stderr what came with
// it, and writes its kubeconfig to stdout or --output.
func runNodesCredentials(cmd *cobra.Command, name string, o *credentialsOptions) error {
	if err := credentials.ValidateNodeName(name); err != nil {
		return err
	}
	opts := o.opts
	if o.ceiling != "" {
		q, err := resource.ParseQuantity(o.ceiling)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("--memory-ceiling %q: want a positive size such as 180Gi", o.ceiling)
		}
		opts.MemoryCeiling = &q
	}
	rc, cs, err := adminClient(o.kubeconfig, o.kubeContext)
	if err != nil {
		return err
	}
	if opts.Server == "" {
		if err := credentials.CheckAdminServer(rc.Host); err != nil {
			return err
		}
	}
	cred, err := credentials.Issue(cmd.Context(), cs, rc, name, opts)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	reportCredential(stderr, name, cred)
	if o.output == "" {
		_, err := cmd.OutOrStdout().Write(cred.Kubeconfig)
		return err
	}
	if err := credentials.WriteFile(o.output, cred.Kubeconfig); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "Wrote the kubeconfig of node %s to %s (mode 0600); its token expires %s\n",
		name, o.output, cred.Expires.UTC().Format(time.RFC3339))
	return nil
}

// reportCredential says on w what issuing node name's credential did besides the
// token: a cleared key pin, warnings, and how the API server authorizes the node.
func reportCredential(w io.Writer, name string, cred *credentials.Credential) {
	if cred.PinReset != "" {
		fmt.Fprintf(w, "Cleared the key pinned to node %s (%s): the next certificate its agent asks for pins a new key\n",
			name, cred.PinReset)
	}
	for _, warning := range cred.Warnings {
		fmt.Fprintln(w, "Warning:", warning)
	}
	switch cred.NodeAuthorization {
	case "":
	case nodeauthz.ModeNone:
		fmt.Fprintln(w, "Warning:", cred.NodeAuthorization.Describe())
	default:
		fmt.Fprintln(w, strings.ToUpper(cred.NodeAuthorization.Describe()[:1])+cred.NodeAuthorization.Describe()[1:])
	}
}

func nodesRevokeCmd() *cobra.Command {
	var kubeconfig, kubeContext string
	cmd := &cobra.Command{
		Use:   "revoke <name>",
		Short: "Revoke every token of a Mac's node identity at once",
		Long: `Replaces the Secret macfleet-nodes/<name>-credential that every token of the Mac is
bound to: the API server refuses all of them from then on, those the agent renewed
included. The Mac's MacNode, replicas and identity stay; its agent cannot reach the API
server until it is given a new credential ("macfleet nodes credentials <name>").
Credentials issued before tokens were bound are not revocable this way: delete the
ServiceAccount macfleet-nodes/<name> to end them.`,
		Example: `  macfleet nodes revoke mac-studio-1`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, cs, err := adminClient(kubeconfig, kubeContext)
			if err != nil {
				return err
			}
			if err := credentials.Revoke(cmd.Context(), cs, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Revoked every token of node %s and cleared the key pinned to it; issue a new one with: macfleet nodes credentials %s\n", args[0], args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "Administrator kubeconfig; default: $KUBECONFIG, then ~/.kube/config, then in-cluster")
	f.StringVar(&kubeContext, "context", "", "Context of the administrator kubeconfig to use")
	return cmd
}

// adminClient is the operator's REST config (adminRestConfig) and a clientset for it.
func adminClient(path, kubeContext string) (*rest.Config, kubernetes.Interface, error) {
	rc, err := adminRestConfig(path, kubeContext)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("building a client: %w", err)
	}
	return rc, cs, nil
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
