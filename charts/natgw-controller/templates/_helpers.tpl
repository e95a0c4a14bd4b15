{{/* Labels of the objects written here: the kustomization's, plus Helm's own. */}}
{{- define "natgw.labels" -}}
app.kubernetes.io/name: natgw-controller
{{ include "natgw.helmLabels" . }}
{{- end }}

{{/* Helm's own labels, added to every object. */}}
{{- define "natgw.helmLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
natgw.fromConfig: an object of controller/config (the file .path, the
document .doc when the file holds several, through the config link) as a
dict, with Helm's labels added to its own (.ctx is the root context).
*/}}
{{- define "natgw.fromConfig" -}}
{{- $text := .ctx.Files.Get .path }}
{{- if hasKey . "doc" }}{{ $text = index (regexSplit "(?m)^---\\s*$" $text -1) .doc }}{{ end }}
{{- $obj := fromYaml $text }}
{{- if not $obj.kind }}{{ fail (printf "chart: %s holds no object (is the config link to controller/config there?)" .path) }}{{ end }}
{{- $labels := merge (include "natgw.helmLabels" .ctx | fromYaml) ($obj.metadata.labels | default dict) }}
{{- $_ := set $obj.metadata "labels" $labels }}
{{- toYaml $obj }}
{{- end }}

{{/* The controller image: repository:tag, tag defaulting to appVersion. */}}
{{- define "natgw.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The webhook's Service DNS name. */}}
{{- define "natgw.webhookHost" -}}
natgw-webhook.{{ .Release.Namespace }}.svc
{{- end }}

{{/* Checks of values the controller would refuse at start, failed at render. */}}
{{- define "natgw.validate" -}}
{{- if not (has .Values.mode (list "replace" "companion")) }}
{{- fail (printf "mode: %q, want replace or companion" .Values.mode) }}
{{- end }}
{{- if not (has .Values.dataplane (list "nftables" "iptables")) }}
{{- fail (printf "dataplane: %q, want nftables or iptables" .Values.dataplane) }}
{{- end }}
{{- if not (has .Values.networkSource (list "" "kube-ovn")) }}
{{- fail (printf "networkSource: %q, want \"\" or kube-ovn" .Values.networkSource) }}
{{- end }}
{{- if and (eq .Values.mode "companion") .Values.admissionPolicy.enabled }}
{{- fail "admissionPolicy.enabled: true with mode companion: its finalizer would hold every NAT object (set admissionPolicy.enabled=false)" }}
{{- end }}
{{- if and (eq .Values.mode "companion") .Values.webhook.enabled }}
{{- fail "webhook.enabled: true with mode companion: the webhook is replace mode's (Kube-OVN's own checks the CRs in companion mode)" }}
{{- end }}
{{- if and (eq .Values.mode "companion") .Values.provisioning.enabled }}
{{- fail "provisioning.enabled: true with mode companion: provisioning is replace mode's" }}
{{- end }}
{{- if and .Values.provisioning.enabled (not .Values.provisioning.gatewayImage) }}
{{- fail "provisioning.gatewayImage: empty, but provisioning.enabled is true (natgw's gateway image is required)" }}
{{- end }}
{{- if and .Values.provisioning.ha (not .Values.provisioning.enabled) }}
{{- fail "provisioning.ha: true, but provisioning.enabled is false (two-replica gateways are a way of provisioning)" }}
{{- end }}
{{- if lt (int .Values.replicas) 1 }}
{{- fail (printf "replicas: %v, want 1 or more" .Values.replicas) }}
{{- end }}
{{- end }}
