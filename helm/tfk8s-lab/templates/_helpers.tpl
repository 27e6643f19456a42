{{/* The release-scoped name prefix of every object. */}}
{{- define "tfk8s-lab.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select one component's pods. Call with (dict "root" . "component" "hub"). */}}
{{- define "tfk8s-lab.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of one component's objects. */}}
{{- define "tfk8s-lab.labels" -}}
{{ include "tfk8s-lab.selectorLabels" . }}
app.kubernetes.io/part-of: tfk8s-lab
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "tfk8s-lab.hub.name" -}}{{ include "tfk8s-lab.fullname" . }}-hub{{- end -}}
{{- define "tfk8s-lab.proxyApi.name" -}}{{ include "tfk8s-lab.fullname" . }}-proxy-api{{- end -}}
{{- define "tfk8s-lab.proxyPublic.name" -}}{{ include "tfk8s-lab.fullname" . }}-proxy-public{{- end -}}
{{- define "tfk8s-lab.secret.name" -}}{{ include "tfk8s-lab.fullname" . }}-hub-secret{{- end -}}

{{/* The hub's values file: {"lab": LabSettings traits, "hub": what tfk8s_hub.hub.configure_hub reads}. */}}
{{/* The ClusterRole of the extension's backend rules, bound per user namespace by the hub. */}}
{{- define "tfk8s-lab.backendRole.name" -}}
{{- printf "%s-%s" .Values.lab.role_name .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tfk8s-lab.hubValues" -}}
{{- $hub := dict
      "hubService" (include "tfk8s-lab.hub.name" .)
      "namespace" .Release.Namespace
      "proxyApiService" (include "tfk8s-lab.proxyApi.name" .)
      "dbUrl" .Values.hub.db.url
      "baseUrl" .Values.hub.baseUrl
      "extraConfig" .Values.hub.extraConfig
      "concurrentSpawnLimit" .Values.hub.concurrentSpawnLimit
      "cull" .Values.cull
      "auth" (dict "class" .Values.auth.class "adminUsers" .Values.auth.adminUsers "allowedUsers" .Values.auth.allowedUsers "allowAll" .Values.auth.allowAll) -}}
{{- $lab := deepCopy .Values.lab -}}
{{- $_ := set $lab "hub_namespace" .Release.Namespace -}}
{{- $_ := set $lab "image_pull_secrets" (include "tfk8s-lab.imagePullSecretNames" . | fromJsonArray) -}}
{{- /* null (helm drops the key) and "" alike: the cluster's default StorageClass */ -}}
{{- $_ := set $lab "storage_class" (.Values.lab.storage_class | default "") -}}
{{- $_ := set $lab "role_name" (include "tfk8s-lab.backendRole.name" .) -}}
{{- dict "lab" $lab "hub" $hub | toPrettyJson -}}
{{- end -}}

{{/* What one placeholder pod holds: placeholder.resources, else the room of one task pod launched
without --cpu/--memory (its single container gets the LimitRange's default request). */}}
{{- define "tfk8s-lab.placeholderResources" -}}
{{- if .Values.placeholder.resources -}}
{{- toYaml .Values.placeholder.resources -}}
{{- else if .Values.lab.default_requests -}}
requests:
{{- range $name, $value := .Values.lab.default_requests }}
  {{ $name }}: {{ $value | toString | quote }}
{{- end }}
{{- else -}}
{{- fail "placeholder.resources is empty and so is lab.default_requests, so a placeholder would hold no room: set placeholder.resources.requests to what one task pod requests" -}}
{{- end -}}
{{- end -}}

{{/* The names of imagePullSecrets (given as strings or as {name: ...}), as a JSON list. */}}
{{- define "tfk8s-lab.imagePullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- if kindIs "map" . -}}
{{- $names = append $names (required "imagePullSecrets: every entry needs a name" .name) -}}
{{- else -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{/* A pod spec's imagePullSecrets (nothing when none are set). Call with the root context. */}}
{{- define "tfk8s-lab.imagePullSecrets" -}}
{{- $names := include "tfk8s-lab.imagePullSecretNames" . | fromJsonArray -}}
{{- if $names -}}
imagePullSecrets:
{{- range $names }}
  - name: {{ . | quote }}
{{- end }}
{{- end -}}
{{- end -}}
