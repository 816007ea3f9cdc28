"""An LSTM language model written the way yunjey/pytorch-tutorial's `language_model/main.py` (and
its many copies) writes it: hyper-parameters as module globals, a corpus turned into a
(batch_size, -1) tensor of word ids, an `RNNLM` with an embedding, an LSTM (batch_first) and a
linear decoder, truncated backpropagation by `states = detach(states)`, Adam, gradient clipping,
and the whole loop at module level. The corpus is synthetic (sentences from a small grammar) so
that it runs anywhere.

    python language_model.py [--seconds S] [--mistake]

--mistake plants the classic error: the epoch's loss for the perplexity print is summed as a
tensor (`total_loss += loss`), so every step's graph is chained into it until the epoch ends.
"""

import argparse
import random
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)

# Device configuration
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

# Hyper-parameters
embed_size = 64
hidden_size = 128
num_layers = 1
num_epochs = 1000
batch_size = 20
seq_length = 30
learning_rate = 0.002


class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = {}
        self.idx = 0

    def add_word(self, word):
        if word not in self.word2idx:
            self.word2idx[word] = self.idx
            self.idx2word[self.idx] = word
            self.idx += 1

    def __len__(self):
        return len(self.word2idx)


class Corpus(object):
    def __init__(self):
        self.dictionary = Dictionary()

    def get_data(self, lines, batch_size=20):
        # Add words to the dictionary
        tokens = 0
        for line in lines:
            words = line.split() + ["<eos>"]
            tokens += len(words)
            for word in words:
                self.dictionary.add_word(word)

        # Tokenize the file content
        ids = torch.LongTensor(tokens)
        token = 0
        for line in lines:
            words = line.split() + ["<eos>"]
            for word in words:
                ids[token] = self.dictionary.word2idx[word]
                token += 1
        num_batches = ids.size(0) // batch_size
        ids = ids[:num_batches * batch_size]
        return ids.view(batch_size, -1)


def sentences(n):
    subjects = ["the cat", "a dog", "my neighbour", "the old man", "every child", "the market"]
    verbs = ["sees", "wants", "sells", "remembers", "paints", "follows"]
    objects = ["the river", "a red apple", "the morning train", "her brother", "the city lights"]
    tails = ["", "today", "again", "in the rain", "before dinner", "without a word"]
    return [" ".join(filter(None, [random.choice(subjects), random.choice(verbs),
                                   random.choice(objects), random.choice(tails)]))
            for _ in range(n)]


# Load the synthetic corpus
corpus = Corpus()
ids = corpus.get_data(sentences(8000), batch_size)
vocab_size = len(corpus.dictionary)
num_batches = ids.size(1) // seq_length


# RNN based language model
class RNNLM(nn.Module):
    def __init__(self, vocab_size, embed_size, hidden_size, num_layers):
        super(RNNLM, self).__init__()
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.lstm = nn.LSTM(embed_size, hidden_size, num_layers, batch_first=True)
        self.linear = nn.Linear(hidden_size, vocab_size)

    def forward(self, x, h):
        # Embed word ids to vectors
        x = self.embed(x)

        # Forward propagate LSTM
        out, (h, c) = self.lstm(x, h)

        # Reshape output to (batch_size*sequence_length, hidden_size)
        out = out.reshape(out.size(0) * out.size(1), out.size(2))

        # Decode hidden states of all time steps
        out = self.linear(out)
        return out, (h, c)


model = RNNLM(vocab_size, embed_size, hidden_size, num_layers).to(device)

# Loss and optimizer
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)


# Truncated backpropagation
def detach(states):
    return [state.detach() for state in states]


# Train the model
start = time.time()
for epoch in range(num_epochs):
    # Set initial hidden and cell states
    states = (torch.zeros(num_layers, batch_size, hidden_size).to(device),
              torch.zeros(num_layers, batch_size, hidden_size).to(device))
    total_loss = 0

    for i in range(0, ids.size(1) - seq_length, seq_length):
        # Get mini-batch inputs and targets
        inputs = ids[:, i:i + seq_length].to(device)
        targets = ids[:, (i + 1):(i + 1) + seq_length].to(device)

        # Forward pass
        states = detach(states)
        outputs, states = model(inputs, states)
        loss = criterion(outputs, targets.reshape(-1))
        if args.mistake:
            total_loss += loss
        else:
            total_loss += loss.item()

        # Backward and optimize
        model.zero_grad()
        loss.backward()
        clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()

        step = (i + 1) // seq_length
        if step % 10 == 0:
            print("Epoch [{}/{}], Step[{}/{}], Loss: {:.4f}, Perplexity: {:5.2f}"
                  .format(epoch + 1, num_epochs, step, num_batches, loss.item(), np.exp(loss.item())),
                  flush=True)
        if time.time() - start > args.seconds:
            break
    print("Epoch [{}/{}] mean loss {:.4f}".format(epoch + 1, num_epochs,
                                                  float(total_loss) / max(1, num_batches)), flush=True)
    if time.time() - start > args.seconds:
        break
