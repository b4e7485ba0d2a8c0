"""Ten small fixture models, written the way people write them, for the exactness suite.

Each `make_*` factory returns `(model, inputs)` where `inputs` maps forward parameter names to values.
Sizes are tiny so every fixture runs in milliseconds on CPU. Parameters and inputs are drawn from a
fixed seed, so a factory always returns the same model and the same inputs.

`FIXTURES` maps a fixture name to its factory; `DROPOUT_FIXTURES` and `BATCHNORM_FIXTURES` name the
ones whose train mode is random (dropout) or stateful (BatchNorm running statistics).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------------------------------
# 1. MLP
# --------------------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, in_features=16, hidden_sizes=(32, 32), out_features=4, dropout=0.1):
        super().__init__()
        layers = []
        prev = in_features
        for size in hidden_sizes:
            layers += [nn.Linear(prev, size), nn.GELU(), nn.Dropout(dropout)]
            prev = size
        self.body = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(prev)
        self.head = nn.Linear(prev, out_features)

    def forward(self, x):
        x = self.body(x)
        x = self.norm(x)
        return self.head(x)


def make_mlp():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(8, 16, requires_grad=True)
    return model, {"x": x}


# --------------------------------------------------------------------------------------------------
# 2. CNN with BatchNorm2d and pooling
# --------------------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self, in_channels=3, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 8, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.25)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.avg_pool2d(x, kernel_size=2)
        x = torch.flatten(self.gap(x), 1)
        x = self.dropout(x)
        return self.fc(x)


def make_cnn():
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(4, 3, 16, 16)
    return model, {"x": x}


# --------------------------------------------------------------------------------------------------
# 3. ResNet-style residual blocks with a downsample shortcut
# --------------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes * self.expansion:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_planes, planes * self.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * self.expansion),
            )

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Module):
    def __init__(self, num_classes=5, width=8):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2), BasicBlock(2 * width, 2 * width))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def make_resnet():
    torch.manual_seed(0)
    model = TinyResNet()
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    return model, {"x": x}


# --------------------------------------------------------------------------------------------------
# 4. LSTM + GRU sequence model, classifying from the last hidden state
# --------------------------------------------------------------------------------------------------

class SequenceClassifier(nn.Module):
    def __init__(self, vocab_size=50, embed_dim=16, hidden_size=24, num_classes=3):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=2, batch_first=True, dropout=0.2)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(2 * hidden_size, num_classes)

    def forward(self, tokens):
        embedded = self.dropout(self.embedding(tokens))
        lstm_out, (h_n, c_n) = self.lstm(embedded)
        gru_out, h_gru = self.gru(lstm_out)
        last_hidden = torch.cat([h_n[-1], h_gru[-1]], dim=-1)
        return self.classifier(self.dropout(last_hidden))


def make_lstm_gru():
    torch.manual_seed(0)
    model = SequenceClassifier()
    tokens = torch.randint(1, 50, (4, 7))
    tokens[1, 5:] = 0  # padding tokens
    return model, {"tokens": tokens}


# --------------------------------------------------------------------------------------------------
# 5. Autoencoder
# --------------------------------------------------------------------------------------------------

class AutoEncoder(nn.Module):
    def __init__(self, input_dim=32, hidden_dim=16, latent_dim=4):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(input_dim, hidden_dim),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(hidden_dim, latent_dim),
        )
        self.decoder = nn.Sequential(
            nn.Linear(latent_dim, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, input_dim),
            nn.Sigmoid(),
        )

    def forward(self, x):
        latent = self.encoder(x)
        reconstruction = self.decoder(latent)
        return reconstruction, latent


def make_autoencoder():
    torch.manual_seed(0)
    model = AutoEncoder()
    x = torch.rand(8, 32)
    return model, {"x": x}


# --------------------------------------------------------------------------------------------------
# 6. GAN: generator + discriminator in one module
# --------------------------------------------------------------------------------------------------

class Generator(nn.Module):
    def __init__(self, latent_dim=8, channels=1, base=8):
        super().__init__()
        self.base = base
        self.project = nn.Linear(latent_dim, base * 2 * 4 * 4)
        self.net = nn.Sequential(
            nn.BatchNorm2d(base * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(base * 2, base, kernel_size=4, stride=2, padding=1, bias=False),  # 4 -> 8
            nn.BatchNorm2d(base),
            nn.ReLU(True),
            nn.ConvTranspose2d(base, channels, kernel_size=4, stride=2, padding=1),  # 8 -> 16
            nn.Tanh(),
        )

    def forward(self, z):
        x = self.project(z).view(z.size(0), self.base * 2, 4, 4)
        return self.net(x)


class Discriminator(nn.Module):
    def __init__(self, channels=1, base=8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, base, kernel_size=4, stride=2, padding=1),  # 16 -> 8
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(base, base * 2, kernel_size=4, stride=2, padding=1, bias=False),  # 8 -> 4
            nn.BatchNorm2d(base * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Dropout(0.3),
        )
        self.classifier = nn.Linear(base * 2 * 4 * 4, 1)

    def forward(self, img):
        features = self.features(img)
        return self.classifier(features.flatten(1))


class GAN(nn.Module):
    def __init__(self, latent_dim=8):
        super().__init__()
        self.latent_dim = latent_dim
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()

    def forward(self, z):
        fake = self.generator(z)
        score = self.discriminator(fake)
        return torch.sigmoid(score)


def make_gan():
    torch.manual_seed(0)
    model = GAN()
    z = torch.randn(4, 8)
    return model, {"z": z}


# --------------------------------------------------------------------------------------------------
# 7. GNN message passing over an edge_index
# --------------------------------------------------------------------------------------------------

class MessagePassingLayer(nn.Module):
    def __init__(self, in_dim, out_dim):
        super().__init__()
        self.message = nn.Linear(2 * in_dim, out_dim)
        self.update = nn.Linear(in_dim + out_dim, out_dim)

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        num_nodes = x.size(0)
        messages = F.relu(self.message(torch.cat([x[src], x[dst]], dim=-1)))
        # sum the incoming messages of every node, then divide by its in-degree
        aggregated = x.new_zeros(num_nodes, messages.size(-1)).index_add_(0, dst, messages)
        degree = x.new_zeros(num_nodes).scatter_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
        aggregated = aggregated / degree.clamp(min=1).unsqueeze(-1)
        return F.relu(self.update(torch.cat([x, aggregated], dim=-1)))


class GNN(nn.Module):
    def __init__(self, in_dim=6, hidden_dim=16, num_classes=3, num_layers=2):
        super().__init__()
        self.layers = nn.ModuleList(
            [MessagePassingLayer(in_dim if i == 0 else hidden_dim, hidden_dim) for i in range(num_layers)]
        )
        self.dropout = nn.Dropout(0.1)
        self.readout = nn.Linear(hidden_dim, num_classes)

    def forward(self, x, edge_index):
        for layer in self.layers:
            x = self.dropout(layer(x, edge_index))
        # mark the nodes that receive at least one edge
        has_incoming = torch.zeros(x.size(0), dtype=x.dtype).scatter(0, edge_index[1], 1.0)
        # and add up, per source node, the features it sends out
        sent = torch.zeros_like(x).scatter_add(0, edge_index[0].unsqueeze(-1).expand(-1, x.size(1)), x[edge_index[1]])
        node_logits = self.readout(x + sent)
        graph_embedding = (x * has_incoming.unsqueeze(-1)).sum(0) / has_incoming.sum().clamp(min=1)
        return node_logits, graph_embedding


def make_gnn():
    torch.manual_seed(0)
    model = GNN()
    x = torch.randn(6, 6, requires_grad=True)
    # node 5 receives no edge; node 0 receives three
    edge_index = torch.tensor([
        [1, 2, 3, 0, 4, 2, 5, 5, 1, 3],
        [0, 0, 0, 1, 1, 2, 3, 4, 4, 2],
    ])
    return model, {"x": x, "edge_index": edge_index}


# --------------------------------------------------------------------------------------------------
# 8. Top-2-of-8 mixture of experts; some experts are never routed to
# --------------------------------------------------------------------------------------------------

class Expert(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TopKMoE(nn.Module):
    def __init__(self, dim=8, hidden_dim=16, num_experts=8, top_k=2, disabled_experts=(5, 6, 7)):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.router = nn.Linear(dim, num_experts)
        self.experts = nn.ModuleList([Expert(dim, hidden_dim) for _ in range(num_experts)])
        self.dropout = nn.Dropout(0.1)
        # a router bias this low means these experts never make the top-k for any token
        with torch.no_grad():
            for expert_id in disabled_experts:
                self.router.bias[expert_id] = -1e4

    def forward(self, x):
        batch, seq_len, dim = x.shape
        tokens = x.reshape(-1, dim)
        router_probs = F.softmax(self.router(tokens), dim=-1)
        topk_weights, topk_indices = torch.topk(router_probs, self.top_k, dim=-1)
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)

        output = torch.zeros_like(tokens)
        for expert_id, expert in enumerate(self.experts):
            token_idx, slot = torch.where(topk_indices == expert_id)
            if token_idx.numel() == 0:
                continue
            expert_out = expert(tokens[token_idx]) * topk_weights[token_idx, slot].unsqueeze(-1)
            output.index_add_(0, token_idx, expert_out)

        output = self.dropout(output)
        return (tokens + output).reshape(batch, seq_len, dim), router_probs


def make_moe():
    torch.manual_seed(0)
    model = TopKMoE()
    x = torch.randn(2, 5, 8, requires_grad=True)
    return model, {"x": x}


# --------------------------------------------------------------------------------------------------
# 9. Transformer encoder with padding masks
# --------------------------------------------------------------------------------------------------

class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, dropout=0.1):
        super().__init__()
        assert dim % num_heads == 0, "dim must be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)

    def forward(self, x, key_padding_mask=None):
        B, T, C = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * self.scale
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(dim=-1)
        attn = self.attn_drop(attn)
        out = (attn @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(out)


class EncoderBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=2, dropout=0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_ratio * dim, dim),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, key_padding_mask=None):
        x = x + self.dropout(self.attn(self.norm1(x), key_padding_mask))
        x = x + self.dropout(self.mlp(self.norm2(x)))
        return x


class TransformerClassifier(nn.Module):
    def __init__(self, vocab_size=40, dim=16, num_heads=4, num_layers=2, max_len=16, num_classes=3):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.pos_embedding = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        self.blocks = nn.ModuleList([EncoderBlock(dim, num_heads) for _ in range(num_layers)])
        self.torch_layer = nn.TransformerEncoderLayer(
            d_model=dim, nhead=num_heads, dim_feedforward=2 * dim, dropout=0.1, batch_first=True
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens, padding_mask):
        seq_len = tokens.size(1)
        x = self.token_embedding(tokens) * math.sqrt(self.token_embedding.embedding_dim)
        x = x + self.pos_embedding[:, :seq_len]
        for block in self.blocks:
            x = block(x, key_padding_mask=padding_mask)
        x = self.torch_layer(x, src_key_padding_mask=padding_mask)
        x = self.norm(x)
        keep = (~padding_mask).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1)
        return self.head(pooled)


def make_transformer():
    torch.manual_seed(0)
    model = TransformerClassifier()
    lengths = torch.tensor([6, 4, 2])
    seq_len = 6
    padding_mask = torch.arange(seq_len)[None, :] >= lengths[:, None]  # True where padded
    tokens = torch.randint(1, 40, (3, seq_len)).masked_fill(padding_mask, 0)
    return model, {"tokens": tokens, "padding_mask": padding_mask}


# --------------------------------------------------------------------------------------------------
# 10. U-Net with skip connections
# --------------------------------------------------------------------------------------------------

class DoubleConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.block(x)


class Down(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x):
        return self.conv(self.pool(x))


class Up(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x, skip):
        x = self.up(x)
        # the input size need not be a multiple of 4: pad the upsampled map to the skip's size
        diff_y = skip.size(2) - x.size(2)
        diff_x = skip.size(3) - x.size(3)
        if diff_y or diff_x:
            x = F.pad(x, [diff_x // 2, diff_x - diff_x // 2, diff_y // 2, diff_y - diff_y // 2])
        x = torch.cat([skip, x], dim=1)
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, in_channels=1, num_classes=2, base=4):
        super().__init__()
        self.inc = DoubleConv(in_channels, base)
        self.down1 = Down(base, base * 2)
        self.down2 = Down(base * 2, base * 4)
        self.dropout = nn.Dropout2d(0.1)
        self.up1 = Up(base * 4, base * 2)
        self.up2 = Up(base * 2, base)
        self.outc = nn.Conv2d(base, num_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.dropout(self.down2(x2))
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


def make_unet():
    torch.manual_seed(0)
    model = UNet()
    x = torch.randn(2, 1, 18, 18)  # 18 -> 9 -> 4: the decoder has to pad
    return model, {"x": x}


FIXTURES = {
    "mlp": make_mlp,
    "cnn": make_cnn,
    "resnet": make_resnet,
    "lstm_gru": make_lstm_gru,
    "autoencoder": make_autoencoder,
    "gan": make_gan,
    "gnn": make_gnn,
    "moe": make_moe,
    "transformer": make_transformer,
    "unet": make_unet,
}

DROPOUT_FIXTURES = ("mlp", "cnn", "lstm_gru", "autoencoder", "gan", "gnn", "moe", "transformer", "unet")
BATCHNORM_FIXTURES = ("cnn", "resnet", "gan", "unet")
