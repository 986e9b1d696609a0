{{/*
Chart name.
*/}}
{{- define "kcg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name, cut to 36 characters: the StatefulSet's pods are "<fullname>-<ordinal>" and a pod's name is its
replica id (GATEWAY_REPLICA_ID: [A-Za-z0-9-]{1,40}), so "-<ordinal>" up to "-999" must still fit. (A
Deployment's pods use their UID as replica id.)
*/}}
{{- define "kcg.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 36 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 36 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 36 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kcg.headlessName" -}}
{{- printf "%s-headless" (include "kcg.fullname" .) }}
{{- end }}

{{- define "kcg.tenantsSecretName" -}}
{{- .Values.tenants.existingSecret | default (printf "%s-tenants" (include "kcg.fullname" .)) }}
{{- end }}

{{- define "kcg.authSecretName" -}}
{{- .Values.auth.existingSecret | default (include "kcg.fullname" .) }}
{{- end }}

{{- define "kcg.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kcg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kcg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kcg.labels" -}}
helm.sh/chart: {{ include "kcg.chart" . }}
{{ include "kcg.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kafka-consumer-gateway
{{- end }}

{{- define "kcg.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kcg.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kcg.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Whether the tenants file is configured.
*/}}
{{- define "kcg.tenantsEnabled" -}}
{{- if or .Values.tenants.file .Values.tenants.existingSecret }}true{{ end }}
{{- end }}

{{/*
Whether the Kafka security protocol uses SASL / TLS.
*/}}
{{- define "kcg.saslEnabled" -}}
{{- if has .Values.kafka.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") }}true{{ end }}
{{- end }}

{{- define "kcg.tlsEnabled" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{/*
Whether the pods get GATEWAY_ADMIN_TOKEN: from auth.existingSecret, a given token, or a generated one.
*/}}
{{- define "kcg.adminToken" -}}
{{- if or .Values.auth.existingSecret .Values.auth.adminToken .Values.auth.generateTokens }}true{{ end }}
{{- end }}

{{/*
A probe from values; with tls.enabled an httpGet probe asks over HTTPS (the kubelet does not verify the
certificate). Called with (list $ probe).
*/}}
{{- define "kcg.probe" -}}
{{- $root := index . 0 }}
{{- $probe := deepCopy (index . 1) }}
{{- if and $root.Values.tls.enabled (hasKey $probe "httpGet") }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
Checks that need more than values.schema.json.
*/}}
{{- define "kcg.validate" -}}
{{- $bootstrap := required "kafka.bootstrap is required: the embedded development broker is never used on Kubernetes" .Values.kafka.bootstrap }}
{{- $v := .Values }}
{{- $budget := addf ($v.preStopSleepSeconds | float64) ($v.gateway.shutdownDrainS | float64) ($v.gateway.shutdownTimeoutS | float64) }}
{{- if le ($v.terminationGracePeriodSeconds | float64) $budget }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepSeconds + gateway.shutdownDrainS + gateway.shutdownTimeoutS (%v): the gateway would be killed before its instances' final commits" $v.terminationGracePeriodSeconds $budget) }}
{{- end }}
{{- if include "kcg.saslEnabled" . }}
{{- if not $v.kafka.sasl.username }}
{{- fail (printf "kafka.sasl.username is required with securityProtocol %s" $v.kafka.securityProtocol) }}
{{- end }}
{{- if not (or $v.kafka.sasl.password $v.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.sasl.password or kafka.sasl.existingSecret is required with securityProtocol %s" $v.kafka.securityProtocol) }}
{{- end }}
{{- end }}
{{- if and $v.tenants.file $v.tenants.existingSecret }}
{{- fail "set tenants.file or tenants.existingSecret, not both" }}
{{- end }}
{{- if and (not $v.auth.existingSecret) (not $v.auth.generateTokens) (not $v.auth.peerToken) }}
{{- fail "auth.generateTokens is false and no peer token is given: the replicas authenticate each other with it (GATEWAY_PEER_TOKEN, required with peers). Set auth.peerToken or auth.existingSecret" }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not (include "kcg.adminToken" .)) }}
{{- fail "serviceMonitor.enabled scrapes /metrics with the admin token, but auth.generateTokens is false and auth.adminToken is empty: set auth.adminToken or auth.existingSecret" }}
{{- end }}
{{- if and $v.tls.enabled (not $v.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: a Secret with the certificate, its key and the CA (tls.certKey, tls.keyKey, tls.caKey)" }}
{{- end }}
{{- if eq $v.auth.adminTokenKey $v.auth.peerTokenKey }}
{{- fail "auth.adminTokenKey and auth.peerTokenKey must differ" }}
{{- end }}
{{- if and (eq $v.workload "Deployment") (not $v.gateway.durableInstances) }}
{{- fail "workload: Deployment needs gateway.durableInstances: true. A Deployment's pods get new names and replica ids on every restart, so without instance descriptors every rollout, scale-in or eviction loses the consumer instances of the pods it stops (their clients get 404 40403). Use workload: StatefulSet without durable instances" }}
{{- end }}
{{- if and $v.autoscaling.enabled (kindIs "invalid" $v.autoscaling.targetCPUUtilizationPercentage) (kindIs "invalid" $v.autoscaling.targetMemoryUtilizationPercentage) }}
{{- fail "autoscaling needs targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage" }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (not (kindIs "invalid" $v.podDisruptionBudget.maxUnavailable)) (not (kindIs "invalid" $v.podDisruptionBudget.minAvailable)) }}
{{- fail "podDisruptionBudget: set maxUnavailable or minAvailable, not both" }}
{{- end }}
{{- end }}
