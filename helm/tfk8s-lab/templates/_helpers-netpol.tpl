{{- /*
Egress rules of Zero-to-JupyterHub's egressAllowRules flags (its _helpers-netpol.tpl), the
same rules tfk8s_hub.bootstrap.egress_allow_rules builds for user namespaces (tests/test_helm_netpol.py
checks they agree). "Private" includes RFC 6598's 100.64.0.0/10 (EKS custom networking, GKE
non-RFC 1918 pod ranges); DNS to private addresses includes NodeLocal DNSCache's link-local
addresses (169.254.20.10 upstream, 169.254.25.10 kubespray); the internet excludes all of
169.254.0.0/16. Call with a dict of the flags.
*/}}
{{- define "tfk8s-lab.privateCidrs" -}}
{{- list "10.0.0.0/8" "172.16.0.0/12" "192.168.0.0/16" "100.64.0.0/10" | toJson -}}
{{- end -}}

{{- define "tfk8s-lab.egressAllowRules" -}}
{{- $private := include "tfk8s-lab.privateCidrs" . | fromJsonArray }}
{{- $metadata := "169.254.169.254/32" }}
{{- if or .dnsPortsCloudMetadataServer .dnsPortsKubeSystemNamespace .dnsPortsPrivateIPs }}
- ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
  to:
  {{- if .dnsPortsCloudMetadataServer }}
    # GKE Cloud DNS answers at the metadata server's address
    - ipBlock:
        cidr: {{ $metadata }}
  {{- end }}
  {{- if .dnsPortsKubeSystemNamespace }}
    # kube-dns / CoreDNS pods
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: kube-system
  {{- end }}
  {{- if .dnsPortsPrivateIPs }}
    # a node-local cache on the kube-dns ClusterIP, or on a link-local address
    {{- range (concat $private (list "169.254.20.10/32" "169.254.25.10/32")) }}
    - ipBlock:
        cidr: {{ . }}
    {{- end }}
  {{- end }}
{{- end }}
{{- if .nonPrivateIPs }}
# the internet: neither private ranges nor link-local (the cloud metadata server)
- to:
    - ipBlock:
        cidr: 0.0.0.0/0
        except: {{ concat $private (list "169.254.0.0/16") | toJson }}
{{- end }}
{{- if .privateIPs }}
- to:
  {{- range $private }}
    - ipBlock:
        cidr: {{ . }}
  {{- end }}
{{- end }}
{{- if .cloudMetadataServer }}
- to:
    - ipBlock:
        cidr: {{ $metadata }}
{{- end }}
{{- end -}}

{{- /*
The addresses (JSON list of CIDRs) the hub reaches the Kubernetes API server at, for its
NetworkPolicy: lab.api_server_cidrs when set; else the addresses of the default/kubernetes
Service and of its EndpointSlice, looked up at install (Calico and kube-router match the endpoint
kube-proxy translates the Service address to); else, when the chart cannot look the cluster up
(helm template, GitOps renderers), the private ranges: the hub must reach the API server to work.
*/}}
{{- define "tfk8s-lab.apiServerCidrs" -}}
{{- $cidrs := list }}
{{- if .Values.lab.api_server_cidrs }}
{{- $cidrs = .Values.lab.api_server_cidrs }}
{{- else }}
{{- $svc := lookup "v1" "Service" "default" "kubernetes" | default dict }}
{{- $spec := get $svc "spec" | default dict }}
{{- $ips := get $spec "clusterIPs" | default list }}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict }}
{{- range (get $slice "endpoints" | default list) }}
{{- $ips = concat $ips (.addresses | default list) }}
{{- end }}
{{- range $ips }}
{{- $cidrs = append $cidrs (ternary (printf "%s/128" .) (printf "%s/32" .) (contains ":" .)) }}
{{- end }}
{{- if not $cidrs }}
{{- $cidrs = include "tfk8s-lab.privateCidrs" . | fromJsonArray }}
{{- end }}
{{- end }}
{{- $cidrs | uniq | toJson -}}
{{- end -}}

{{- /* The TCP ports of the API server: lab.api_server_ports and its EndpointSlice's ports. */}}
{{- define "tfk8s-lab.apiServerPorts" -}}
{{- $ports := list }}
{{- range .Values.lab.api_server_ports }}{{ $ports = append $ports (int .) }}{{ end }}
{{- if not .Values.lab.api_server_cidrs }}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict }}
{{- range (get $slice "ports" | default list) }}{{ $ports = append $ports (int .port) }}{{ end }}
{{- end }}
{{- $ports | uniq | toJson -}}
{{- end -}}

{{- /* Whether to render the Cilium policies: networkPolicy.ciliumApiServer, or, when null, whether
the cluster serves Cilium's policy CRDs. */}}
{{- define "tfk8s-lab.cilium" -}}
{{- $set := .Values.networkPolicy.ciliumApiServer }}
{{- if kindIs "bool" $set }}{{ ternary "true" "" $set }}
{{- else if .Capabilities.APIVersions.Has "cilium.io/v2/CiliumClusterwideNetworkPolicy" }}true
{{- end }}
{{- end -}}
